# shellcheck shell=bash
# Usage: source utils/launch/site.sh   (after lib.sh; used by prepare_launch in launch_lib.sh)
#
# Site settings: the defaults a cluster's admin writes once (partition, account, GPU flags, image,
# registry credentials file, mounts, network interfaces) in configs/site.env.sh or the file
# MST_SITE_FILE names (docs/configs.md "Site settings"). The file is read as data, never sourced:
# only comment lines and `export NAME=VALUE` lines (VALUE plain, '...' or "..." without ` \; only
# $USER and $HOME expand), only the names in SITE_VARS. Every value applies only where the caller's environment has not
# set the variable; command-line flags win over SITE_SBATCH_FLAGS.
#   site_load REPO          read and check the site file, apply it, set MST_SITE_APPLIED (what it
#                           contributed, secret values redacted) and SITE_SBATCH (its sbatch
#                           flags, each one word --name[=value]); dies with FILE:LINE on bad input
#   site_sbatch FLAG...     split SITE_SBATCH against the user's sbatch flags: SITE_SBATCH_KEPT
#                           (go before the user's) and SITE_SBATCH_DROPPED (the user gave the
#                           option, or set sbatch's variable for it: SBATCH_PARTITION ...); the
#                           kept ones are added to MST_SITE_APPLIED as sbatch=FLAG

# The variables a site file may set (the rows of utils/launch/settings.tsv whose site column says
# yes); anything else is refused (the list is in the error).
SITE_VARS=$(settings_names site | tr '\n' ' ')
SITE_VARS=${SITE_VARS% }

# sbatch's one-letter options and their long names: with a value (-p gpu, -pgpu) and without.
SBATCH_SHORT_ARG="A=account a=array b=begin C=constraint c=cpus-per-task D=chdir d=dependency
e=error F=nodefile G=gpus i=input J=job-name L=licenses M=clusters m=distribution N=nodes n=ntasks
o=output p=partition q=qos S=core-spec t=time w=nodelist x=exclude"
SBATCH_SHORT_FLAG="H=hold k=no-kill O=overcommit Q=quiet s=oversubscribe v=verbose W=wait"
# sbatch takes a unique prefix of a long name (--part=gpu); these whole names are prefixes of
# other options, so --mem never stands for --mem-per-gpu.
SBATCH_PREFIX_NAMES="bb container export extra gpus gres mem ntasks time wait"
# options that set one thing (sbatch refuses or silently picks one of them): a user's one drops
# the site's other
SBATCH_SAME_SETTING="exclusive,oversubscribe mem,mem-per-cpu,mem-per-gpu"

# site_file_of REPO: the site file to read (MST_SITE_FILE, else REPO/configs/site.env.sh), or
# nothing when there is none; dies when MST_SITE_FILE names nothing readable.
site_file_of() {
  local f
  if [[ -v MST_SITE_FILE ]]; then
    f=$MST_SITE_FILE
    [[ -n "$f" ]] || die "MST_SITE_FILE is set but empty: name a site file, or MST_SITE_FILE=/dev/null for none"
    [[ "$f" == /* ]] || f=$PWD/$f
    [[ -e "$f" ]] ||
      die "MST_SITE_FILE='$MST_SITE_FILE' does not exist; name a site file (configs/site.env.sh.example) or unset it"
  else
    f=$1/configs/site.env.sh
    [[ -e "$f" ]] || return 0
  fi
  [[ ! -d "$f" && -r "$f" ]] || die "site file '$f' is not a readable file"
  printf '%s\n' "$f"
}

site_load() {
  local file line n=0 name value re
  local -A val=() at=()
  local -a order=()
  # VALUE: plain, '...', or "..." without ` \ ; $ only in $USER, $HOME (site_expand)
  re='^[[:space:]]*export[[:space:]]+([A-Za-z_][A-Za-z0-9_]*)='
  re+="([A-Za-z0-9_./:,=@%+^\${}-]*|'[^']*'|\"[^\"\`\\\\]*\")([[:space:]]+#.*)?[[:space:]]*\$"
  MST_SITE_APPLIED="" SITE_SBATCH=() SITE_SET=()
  file=$(site_file_of "$1") || exit 1
  SITE_FILE=$file
  if [[ -n "$file" ]]; then
    while IFS= read -r line || [[ -n "$line" ]]; do
      n=$((n + 1))
      [[ "$line" != *$'\r' ]] ||
        die "$file:$n: the line ends in a carriage return (Windows line ends); convert the file with dos2unix"
      [[ "$line" =~ ^[[:space:]]*(#.*)?$ ]] && continue
      if ! [[ "$line" =~ $re ]] || { name=${BASH_REMATCH[1]} value=${BASH_REMATCH[2]}
           [[ "$value" != \'* ]] && ! value=$(site_expand "$value"); }; then
        die "$file:$n: not a comment or an 'export NAME=VALUE' line (VALUE plain, '...' or \"...\"," \
          "no \` or \\, no \$ but in \$USER and \$HOME: the site file is read as data, not run)"
      fi
      [[ "$value" == [\"\']* ]] && value=${value:1:-1}
      [[ " $SITE_VARS " == *" $name "* ]] ||
        die "$file:$n: '$name' is not a site setting; a site file may set: $SITE_VARS"
      [[ ! -v "at[$name]" ]] || die "$file:$n: $name is set twice (also on line ${at[$name]}); keep one"
      at[$name]=$n val[$name]=$value
      order+=("$name")
    done < "$file"
    MST_SITE_APPLIED=$(site_shown "file=$file")
  fi
  # the caller's environment wins, even where it sets a variable empty
  local sbatch_from="your environment"
  for name in "${order[@]}"; do
    [[ -v "$name" ]] && continue
    SITE_SET+=("$name")
    if [[ "$name" == SITE_SBATCH_FLAGS ]]; then
      SITE_SBATCH_FLAGS=${val[$name]} sbatch_from=$file
      continue
    fi
    export "$name=${val[$name]}"
    MST_SITE_APPLIED+=" $(site_shown "$(shown_kv env "$name=${val[$name]}")")"
  done
  site_sbatch_words "$sbatch_from"
}

# site_expand VALUE: VALUE (plain or "...") with $USER, ${USER}, $HOME and ${HOME} replaced by the
# caller's; status 1 when any other $ is left, or a brace outside "..." (brace expansion).
# shellcheck disable=SC2016  # '$USER' and '$HOME' are the text looked for, not expansions
site_expand() {
  local v=$1 rest user
  rest=${v//'${USER}'/}; rest=${rest//'${HOME}'/}
  while [[ "$rest" =~ ^(.*)\$(USER|HOME)([^A-Za-z0-9_].*)?$ ]]; do rest=${BASH_REMATCH[1]}${BASH_REMATCH[3]}; done
  [[ "$rest" != *'$'* && ( "$v" == \"* || "$rest" != *[{}]* ) ]] || return 1
  if [[ "$v" == *'$'* ]]; then
    [[ -n "${HOME:-}" || ( "$v" != *'$HOME'* && "$v" != *'${HOME}'* ) ]] || return 1
    user=${USER:-$(id -un)}
    v=${v//'${USER}'/$user}; v=${v//'$USER'/$user}; v=${v//'${HOME}'/$HOME}; v=${v//'$HOME'/$HOME}
  fi
  printf '%s\n' "$v"
}

# site_sbatch_words FROM: SITE_SBATCH_FLAGS as one-word long options in SITE_SBATCH, checked like
# the user's flags (check_sbatch_flags); FROM (the file, or "your environment") is named in an error.
site_sbatch_words() {
  local -a words
  local w i=0 long msg where="SITE_SBATCH_FLAGS (from $1)"
  read -r -d '' -a words <<< "${SITE_SBATCH_FLAGS:-}" || true
  while (( i < ${#words[@]} )); do
    w=${words[i]}; i=$((i + 1))
    if [[ "$w" =~ ^--[a-z][a-z0-9-]*(=.*)?$ ]]; then SITE_SBATCH+=("$w"); continue; fi
    [[ "$w" =~ ^-([A-Za-z])(.*)$ ]] ||
      die "$where: '$w' is not an option; write each flag as one word, --name=value or --name" \
        "(e.g. --partition=gpu --exclusive)"
    if long=$(sbatch_long_name "${BASH_REMATCH[1]}" arg); then
      if [[ -n "${BASH_REMATCH[2]}" ]]; then SITE_SBATCH+=("--$long=${BASH_REMATCH[2]}")
      elif (( i < ${#words[@]} )); then SITE_SBATCH+=("--$long=${words[i]}"); i=$((i + 1))
      else die "$where: '$w' needs a value, e.g. --$long=VALUE"; fi
    elif long=$(sbatch_long_name "${BASH_REMATCH[1]}" flag) && [[ -z "${BASH_REMATCH[2]}" ]]; then
      SITE_SBATCH+=("--$long")
    else
      die "$where: unknown short option '$w'; write the long one, --name=value"
    fi
  done
  if (( ${#SITE_SBATCH[@]} )) && ! msg=$(check_sbatch_flags "${SITE_SBATCH[@]}" 2>&1); then
    die "$where: ${msg#*: }"
  fi
  return 0
}

# sbatch_long_name LETTER arg|flag: the long name of a one-letter sbatch option (status 1: none).
sbatch_long_name() {
  local table=$SBATCH_SHORT_FLAG pair
  [[ "$2" == arg ]] && table=$SBATCH_SHORT_ARG
  for pair in $table; do [[ "${pair%%=*}" == "$1" ]] && { printf '%s\n' "${pair#*=}"; return 0; }; done
  return 1
}

# sbatch_same A B: true when the long option names A and B (either may be abbreviated) set one thing.
sbatch_same() {
  local a=$1 b=$2 short long group
  [[ "$a" == "$b" ]] && return 0
  if (( ${#a} < ${#b} )); then short=$a long=$b; else short=$b long=$a; fi
  [[ "$long" == "$short"* && " $SBATCH_PREFIX_NAMES " != *" $short "* ]] && return 0
  for group in $SBATCH_SAME_SETTING; do
    [[ ",$group," == *",$a,"* && ",$group," == *",$b,"* ]] && return 0
  done
  return 1
}

site_sbatch() {
  local f s name g
  local -a given=()
  SITE_SBATCH_KEPT=() SITE_SBATCH_DROPPED=()
  for f in "$@"; do
    if [[ "$f" =~ ^--([a-z][a-z0-9-]*) ]]; then given+=("${BASH_REMATCH[1]}")
    elif [[ "$f" =~ ^-([A-Za-z]) ]]; then
      name=$(sbatch_long_name "${BASH_REMATCH[1]}" arg || sbatch_long_name "${BASH_REMATCH[1]}" flag) &&
        given+=("$name")
    fi
  done
  for s in "${SITE_SBATCH[@]}"; do
    name=${s#--}; name=${name%%=*}
    # sbatch's input variables (SBATCH_PARTITION, SBATCH_TIMELIMIT ...) are yours too, and its
    # command line would beat them
    g=SBATCH_${name^^}; g=${g//-/_}; [[ "$name" == time ]] && g=SBATCH_TIMELIMIT
    [[ -v "$g" ]] && { SITE_SBATCH_DROPPED+=("$s"); continue; }
    for g in "${given[@]}"; do
      sbatch_same "$name" "$g" && { SITE_SBATCH_DROPPED+=("$s"); continue 2; }
    done
    SITE_SBATCH_KEPT+=("$s")
    MST_SITE_APPLIED+="${MST_SITE_APPLIED:+ }$(site_shown "sbatch=$s")"
  done
}

# site_shown NAME=VALUE: the pair as one word: as it is when VALUE is plain, else VALUE quoted.
site_shown() {
  local name=${1%%=*} value=${1#*=}
  if [[ "$value" =~ ^[A-Za-z0-9_./:,=@%+^\<\>-]*$ ]]; then printf '%s\n' "$1"
  elif [[ "$value" != *"'"* ]]; then printf "%s='%s'\n" "$name" "$value"
  else printf '%s=%q\n' "$name" "$value"; fi
}

# site_blame MSG: MSG, plus the site file's name when the variable MSG names came from it.
site_blame() {
  local n
  for n in "${SITE_SET[@]}"; do
    if [[ "$1" =~ (^|[^A-Z0-9_])$n([^A-Z0-9_]|$) ]]; then
      printf '%s (%s is set by the site file %s)\n' "$1" "$n" "$SITE_FILE"
      return 0
    fi
  done
  printf '%s\n' "$1"
}
