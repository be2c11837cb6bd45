"""The host command bridge: agents in containers run an allowlist of read-only Slurm and
launcher commands on the host, through a private Unix socket (docs/host-bridge.md).

    policy  which argv may run (the allowlist, argument checks) and how (resolved argv, timeout)
    server  `serve` and `stop`: the socket in a 0700 directory, SO_PEERCRED, config, audit log
    client  `call`: sends one argv, prints the command's output, exits with its status
    cli     the command line of utils/host_bridge.py

Standard library only; the client side runs under Python 3.8 or newer (a container's python).
"""
