# The tsdb-diagnosis skill's check step (SKILL.md step 4): rerun a finding's `verify` checks and compare.
# Used as a module: jq -L skills/tsdb-diagnosis 'include "verify"; ...'. Schema: docs/diagnose.md (diagnose/2).
# utils/verify.py JOB does the same for every finding in one call (the MCP tool `verify` too).

# The finding to check in a diagnose.py --json report: the one that gave the verdict, else the first;
# nothing when there are no findings.
def finding: . as $r | first(($r.findings[] | select(.kind == $r.verdict)), $r.findings[]);

# A verify check -> the arguments of `utils/prometheus.sh query`, tab-separated: the TSDB it runs on (the
# job's, or the other job's for a --vs check), the query and its range.
def args: [.tsdb, .query, "--range", (.start | tostring), (.end | tostring), (.step | tostring)] | @tsv;

def median: sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor]
  else (.[length / 2 - 1] + .[length / 2]) / 2 end;

def reduce_with($r):
  if $r == "max" then max elif $r == "min" then min elif $r == "mean" then add / length
  elif $r == "median" then median elif $r == "last" then .[-1] elif $r == "delta" then .[-1] - .[0]
  else error("unknown reducer \($r)") end;

# Equal within 1e-4 relative (1e-9 absolute), as utils/verify.py compares (diagnose.py rounds to 6 digits).
def close($a; $b): ($a == null and $b == null)
  or ($a != null and $b != null and (($a - $b) | fabs) <= ([1e-4 * ([($a | fabs), ($b | fabs)] | max), 1e-9] | max));

# Prometheus' response to a check's query -> {signal, job, per_host, got, expect, match}: every host's value
# under the reducer, the same summary diagnose.py made (culprits, accused, peers_median | hosts_median | job)
# and whether the two agree.
def check($v):
  ([.data.result[] | {key: (.metric.host // ""),
      value: ([.values[][1] | tonumber | select(isinfinite or isnan | not)] | if length > 0 then reduce_with($v.reducer) else null end)}
    | select(.value != null)] | from_entries) as $per
  | ($v.expect.culprits | keys) as $culprits
  | (($v.expect.accused // {}) | keys) as $accused
  | {culprits: ($culprits | map({key: ., value: $per[.]}) | from_entries)}
  | if $v.expect.accused then .accused = ($accused | map({key: ., value: $per[.]}) | from_entries) else . end
  | if $v.expect | has("job") then .job = $per[""]
    elif $v.expect | has("peers_median") then
      .peers_median = ([$per | to_entries[] | select(.key as $h | ($culprits + $accused) | index($h) | not) | .value] | median)
    else .hosts_median = ([$per[]] | median) end
  | . as $got
  | {signal: $v.signal, job: $v.job, per_host: $per, got: $got, expect: $v.expect, direction: $v.direction,
     baseline: $v.baseline,
     match: ([$v.expect | paths(scalars or . == null) as $p | close($got | getpath($p); $v.expect | getpath($p))] | all)};
