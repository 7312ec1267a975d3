#!/usr/bin/env bash
# Commit subjects read `component: summary`, at most 72 columns, where a
# component is a crate (crates/NAME) or one of the areas below, and
# several may be named with commas (`vgpu-device, vgpu-sched: ...`).
# Checks the commits after the one where the rule began (merges aside).
#
# usage: ci/check-commits.sh [SINCE]    (default: the rule's first commit)
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$VGPUD_ROOT"

since=${1:-9934547}
areas=(build ci docs fuzz guest-driver resources tests)
mapfile -t crates < <(find crates -mindepth 1 -maxdepth 1 -type d -printf '%f\n')
known=" ${areas[*]} ${crates[*]} "

if ! git rev-parse -q --verify "${since}^{commit}" >/dev/null; then
    log "no commit $since here (a shallow clone?): nothing to check"
    exit 0
fi
bad=0
n=0
while IFS= read -r line; do
    n=$((n + 1))
    sha=${line%% *}
    subject=${line#* }
    why=
    if ((${#subject} > 72)); then
        why="longer than 72 columns (${#subject})"
    elif [[ ! $subject =~ ^([a-z0-9._/-]+(,\ [a-z0-9._/-]+)*):\ [^\ ] ]]; then
        why="not 'component: summary'"
    else
        IFS=',' read -r -a named <<<"${BASH_REMATCH[1]// /}"
        for c in "${named[@]}"; do
            [[ $known == *" ${c%%/*} "* ]] || why="unknown component '$c'"
        done
    fi
    if [[ -n $why ]]; then
        log "$sha: $why: $subject"
        bad=$((bad + 1))
    fi
done < <(git log --no-merges --format='%h %s' "${since}..HEAD")
((bad == 0)) || die "$bad of $n commit subjects break the rule (components: ${areas[*]} or a crate)"
log "$n commit subjects since $since read 'component: summary' within 72 columns"
