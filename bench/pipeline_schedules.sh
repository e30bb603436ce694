#!/usr/bin/env bash
# Pipeline schedules on this machine (issue 17): for configs A and B at m = 8 micro-batches,
# pp 2 (one rank per core) and pp 4 (oversubscribed: four ranks on two cores, labelled so),
# (and M: B's blocks on even stages) each schedule's measured bubble (Note [Measured bubble] in cli/compare_cmd.cc: from the
# run's --trace, the first step and a stream's flushing steps left out) and steady global tokens/s, against 1F1B in the
# same run, and the simulator's predicted bubble for the same layout (--cluster local).
# "floor m / p": the bubble the unequal stage work leaves under any schedule (Note [Bubble
# floor] in sim/simulator.h), measured in the run and predicted; a measured floor above the
# predicted one is a rank the machine slowed. BEST_OF=N runs each layout N times and keeps
# the fastest run (default 1). SPLITS="5,1 6,0" also runs each schedule at pp 2 with those
# stage splits (parallel.pp_layers; a 0 end stage only embeds or only runs the head: Note
# [Stage split]), each where its count of stages is the row's (pp x vpp: "1,1,2,2" for zb-v).
# A schedule written S+v runs S with the vocabulary split over the pipeline (parallel.pp_vocab,
# Note [Vocabulary passes]), e.g. SCHEDULES="1f1b 1f1b+v zb-h1+v". zb-v and interleaved run two
# model chunks a rank (--vpp 2), the rest one.
# PPS="2" runs only those pipeline depths (default "2 4"). A zb-h1 row also prints the Zero
# Bubble paper's bubble for it at the run's F:B:W (of 1F1B's; 1F1B+v's for zb-h1+v), the points
# over it with the floors out (the paper's share of 1F1B's bubble above 1F1B's measured floor,
# against ZB-H1's bubble above its own: the paper's figure is for equal stages, and a rank the
# machine slowed adds to both bubbles a floor no schedule removes), and the
# least any schedule of its stages can have (zb_h1_figures; issue 55); a zb-v row that least
# too (the floor with the ramp: ZB-V's rank r waits for stages 0 .. r - 1's first forwards).
# REPEAT=N runs the whole set N times, one after another (so a disturbance of the machine falls
# on one repetition of every row, not on all of one row's), prints each repetition's rows and
# then per row the medians: measured and predicted bubble, how many repetitions lie within 3
# points of the simulator, the bubble over the measured floor, the error with each floor taken
# out ((measured - floor m) - (predicted - floor p): the schedule's own bubble, where a rank the
# machine slowed raises both measured figures alike), for zb-h1 rows the points over the
# paper's figure, as it is and with the floors out (repetitions within 2 each), and for zb-h1 and zb-v rows the points over the least
# any schedule can have. Summary: repeat_summary below.
# Needs a release build; calibrates the local cluster first unless it exists.
# Usage: bench/pipeline_schedules.sh [steps] [configs...] [-- schedules...]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-6}; shift || true
configs=${*:-A B}
schedules=${SCHEDULES:-1f1b zb-h1 zb-h2 zb-v}
best_of=${BEST_OF:-1}
loom=build/release/loom
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
[[ -f ~/.cache/loom/cluster-local.toml ]] || env -u OPENBLAS_CORETYPE "$loom" calibrate > /dev/null

model_sets() {
  case $1 in
    A) echo "model.preset=tiny train.batch=16" ;;
    B) echo "model.preset=gpt2 model.layers=6 model.d_model=384 model.heads=6 model.ffn=1536 model.ctx=256 train.batch=8" ;;
    # B's blocks with 8 layers and a 2,048-token vocabulary: stages of equal work, so the
    # bubble is the schedule's (B's is its 50,257-row LM head on the last stage).
    M) echo "model.preset=gpt2 model.layers=8 model.d_model=384 model.heads=6 model.ffn=1536 model.ctx=256 model.vocab=2048 train.batch=8" ;;
  esac
}

# Steady-state global tokens/s from the --json step lines (the first $2 steps dropped).
tok_s() {
  /usr/bin/python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{") and "tokens_per_s" in l][int(sys.argv[2]):]
print(round(len(rows) / sum(1 / r["tokens_per_s"] for r in rows), 1))' "$1" "$2"
}

# Zero Bubble's (Qi et al. 2024, Sec. 3) ZB-H1 bubble against 1F1B's, (T_F + T_B - T_W) /
# (T_F + T_B + T_W), at this run's F : B : W (each phase's median span a micro-batch, averaged
# over the ranks); and the least bubble any schedule of these stages can have: rank r starts
# no sooner than the forwards of the first micro-batch on the ranks before it (lead_r), so a
# step lasts at least max_r (lead_r + busy_r), busy_r the rank's pipeline spans a step
# (vocabulary passes included): bubble >= 1 - sum_r busy_r / (p x max_r (lead_r + busy_r)).
# The paper's figure assumes equal stages; where the last stage is the busiest (a head) the
# bound can lie above it.
zb_h1_figures() {
  /usr/bin/python3 -c '
import json, re, statistics, sys
t = json.load(open(sys.argv[1])); ev = t["traceEvents"] if isinstance(t, dict) else t
spans = [e for e in ev if e.get("cat") == "pipeline" and re.match(r"[FBWV]-?[0-9]+([.][0-9]+)?$", e["name"])]
ranks = sorted({e["pid"] for e in spans})
starts = sorted(e["ts"] for e in spans if e["pid"] == ranks[0] and e["name"] in ("F0", "F0.0")) + [float("inf")]
d, busy, first = {}, {}, {}  # steps after the first (Note [Measured bubble]): a step from the first rank F0 to the next
for e in spans:
    k = max(i for i, s in enumerate(starts) if s <= e["ts"] + 1e-3) if e["ts"] + 1e-3 >= starts[0] else 0
    if k == 0: continue
    d.setdefault((e["pid"], e["name"][0]), []).append(e["dur"])
    if e["name"][0] == "F" and not e["name"].endswith((".1", ".2", ".3")):  # chunk 0: stage r of rank r
        first.setdefault(e["pid"], []).append(e["dur"])
    busy[(e["pid"], k)] = busy.get((e["pid"], k), 0) + e["dur"]
med = {k: statistics.median(v) for k, v in d.items()}
f, b, w = (statistics.mean(med[(r, ph)] for r in ranks) for ph in "FBW")
per_step = [statistics.median(v for (q, k), v in busy.items() if q == r) for r in ranks]
lead = [sum(statistics.median(first[q]) for q in ranks[:i]) for i in range(len(ranks))]
bound = 1 - sum(per_step) / (len(ranks) * max(l + x for l, x in zip(lead, per_step)))
print("%.3f %.2f:%.2f:%.2f %.4f" % ((f + b - w) / (f + b + w), f / 1e3, b / 1e3, w / 1e3, bound))' "$1"
}

# Per (cfg, layout, schedule) over the repetitions' rows on stdin (the table's columns; the
# floors and the zb-h1 paper figure parsed from their text).
repeat_summary() {
  /usr/bin/python3 -c '
import re, statistics as st, sys
rows = {}
for line in sys.stdin:
    m = re.match(r"(\S+)\s+(pp\d+ m\d+(?: [0-9,]+)?)\s+(\S+)\s+([0-9.]+)%\s+([0-9.]+)%\s+([0-9.]+) / ([0-9.]+)", line)
    if not m: continue
    paper = re.search(r"paper ([0-9.]+)%", line)
    bound = re.search(r"any schedule >= ([0-9.]+)%", line)
    out = re.search(r"floors out ([-+][0-9.]+) pt", line)
    rows.setdefault(m.group(1, 2, 3), []).append([float(x) for x in m.group(4, 5, 6, 7)] + [float(paper.group(1)) if paper else None]
                                                 + [float(bound.group(1)) if bound else None, float(out.group(1)) if out else None])
print("%-4s %-14s %-7s %3s %9s %9s %9s %8s %11s %11s  %s" % ("cfg", "layout", "sched", "n", "measured~", "predicted", "error~", "<= 3 pt", "over floor~", "floors out~", "paper"))
for (c, layout, s), v in rows.items():
    err = [m - p for m, p, fm, fp, _, _, _ in v]
    papers = [m - pa for m, p, fm, fp, pa, _, _ in v if pa is not None]
    bounds = [m - bd for m, p, fm, fp, _, bd, _ in v if bd is not None]
    outs = [o for *_, o in v if o is not None]
    within = lambda ds: "(within 2 in %d of %d)" % (sum(d <= 2 for d in ds), len(ds))
    note = "%+.1f pt %s" % (st.median(papers), within(papers)) if papers else ""
    if outs: note += "; floors out %+.1f pt %s" % (st.median(outs), within(outs))
    if bounds: note += ("; " if note else "") + "%+.1f pt over any schedule" % st.median(bounds)
    print("%-4s %-14s %-7s %3d %8.1f%% %8.1f%% %+8.1f %5d/%-2d %+11.1f %+11.1f  %s" % (c, layout, s, len(v), st.median(x[0] for x in v),
          st.median(x[1] for x in v), st.median(err), sum(abs(e) <= 3 for e in err), len(v),
          st.median(m - fm for m, p, fm, fp, *_ in v), st.median((m - fm) - (p - fp) for m, p, fm, fp, *_ in v), note))'
}

if (( ${REPEAT:-1} > 1 )); then  # the whole set REPEAT times, then the medians
  for ((r = 1; r <= REPEAT; r++)); do
    echo "repetition $r of $REPEAT"
    REPEAT=1 "$0" "$steps" $configs | tee -a "$tmp/rows"
  done
  echo; echo "medians over $REPEAT repetitions (points; floors out: the schedule's own bubble, measured less predicted)"
  repeat_summary < "$tmp/rows"
  exit 0
fi

# pipedream / pipemare update after every minibatch: one micro-batch per step (the same
# micro-batch as the others' m = 8), 8 times the steps, no clipping (no global norm exists).
per_batch() { [[ $1 == pipedream || $1 == pipemare ]]; }

printf "%-4s %-14s %-7s %10s %10s %11s %9s %10s %s\n" cfg layout sched "measured" "predicted" "floor m / p" "tokens/s" "vs 1f1b" note
for c in $configs; do
  for pp in ${PPS:-2 4}; do
    note=$([[ $pp == 4 ]] && echo "oversubscribed: 4 ranks on 2 cores" || echo "")
    ref_bubble="" ref_tok="" ref_v_bubble=""
    splits="-"; [[ $pp == 2 ]] && splits="- ${SPLITS:-}"
    for split in $splits; do
    for sv in $schedules; do
      s=${sv%+v} vocab=""; [[ $sv == *+v ]] && vocab="parallel.pp_vocab=true"
      vpp=1; [[ $s == zb-v || $s == interleaved ]] && vpp=2
      layout="pp$pp m8" split_args=()
      if [[ $split != - ]]; then
        (( $(tr ',' '\n' <<< "$split" | wc -l) == pp * vpp )) || continue  # a split per stage count
        layout="pp$pp m8 $split" split_args=(--pp-layers "$split")
      fi
      layers=$(model_sets "$c" | { grep -o "model.layers=[0-9]*" || true; } | cut -d= -f2); layers=${layers:-4}  # tiny: 4
      if (( layers < pp * vpp )); then
        printf "%-4s %-14s %-7s %s\n" "$c" "$layout" "$sv" "n/a: $layers layers < pp x vpp = $((pp * vpp))"
        continue
      fi
      ga=8 n=$((steps + 2)) drop=2 extra="$vocab"
      if per_batch "$s"; then
        batch=$(model_sets "$c" | grep -o "train.batch=[0-9]*" | cut -d= -f2)
        ga=1 n=$((8 * (steps + 2))) drop=16 extra="$vocab train.batch=$((batch / 8)) optim.grad_clip=0"
      fi
      best=0  # BEST_OF runs, keeping the fastest (the machine's least disturbed one)
      for ((try = 0; try < best_of; try++)); do
        env -u OPENBLAS_CORETYPE "$loom" train --json --nproc "$pp" --pp "$pp" --vpp "$vpp" --grad-accum "$ga" \
          --schedule "$s" "${split_args[@]}" --set $(model_sets "$c") $extra checkpoint.dir= train.val_every=0 train.val_batches=1 \
          train.log_every=1 "train.steps=$n" train.threads=1 --trace "$tmp/t.json" > "$tmp/t.out" 2> "$tmp/m.err"
        t=$(tok_s "$tmp/t.out" "$drop")
        if /usr/bin/python3 -c "import sys; sys.exit(0 if $t > $best else 1)"; then
          best=$t; mv "$tmp/t.json" "$tmp/m.json"; mv "$tmp/t.out" "$tmp/m.out"
        fi
      done
      "$loom" simulate --cluster local --gpus "$pp" --pp "$pp" --vpp "$vpp" --grad-accum "$ga" --schedule "$s" \
        "${split_args[@]}" --set $(model_sets "$c") $extra --trace "$tmp/p.json" > /dev/null
      read -r pred meas floor pfloor < <("$loom" compare --json "$tmp/p.json" "$tmp/m.json" | /usr/bin/python3 -c '
import json, sys
rows = json.load(sys.stdin)
row = [r for r in rows if r["category"] == "pipeline bubble"][0]
floor = [r for r in rows if r["category"] == "bubble floor"][0]
print(row["predicted"], row["measured"], floor["measured"], floor["predicted"])')
      tok=$best
      [[ -z $ref_bubble ]] && ref_bubble=$meas ref_tok=$tok ref_floor=$floor
      [[ $sv == 1f1b+v && $split == - ]] && ref_v_bubble=$meas ref_v_floor=$floor
      paper=""  # ZB-H1: the paper's share of 1F1B's bubble (1F1B+v's for zb-h1+v), at this run's F:B:W
      ref=$ref_bubble rf=$ref_floor; [[ -n $vocab ]] && ref=$ref_v_bubble rf=$ref_v_floor
      if [[ $s == zb-h1 && $split == - && -n $ref ]]; then  # default split only (its 1F1B is ref)
        read -r ratio fbw bound < <(zb_h1_figures "$tmp/m.json")
        paper=$(/usr/bin/python3 -c "print('; paper %.1f%% (%.3f x %.1f%%, F:B:W %s ms), floors out %+.1f pt, any schedule >= %.1f%%' % (100*$ratio*$ref, $ratio, 100*$ref, '$fbw', 100*(($meas - $floor) - $ratio*($ref - $rf)), 100*$bound))")
      elif [[ $s == zb-v ]]; then  # the ramp-aware bound too (ZB-V's rank r waits for stages 0 .. r - 1's F)
        read -r ratio fbw bound < <(zb_h1_figures "$tmp/m.json")
        paper=$(/usr/bin/python3 -c "print('; any schedule >= %.1f%%' % (100*$bound))")
      fi
      printf "%-4s %-14s %-7s %9.1f%% %9.1f%% %11s %9s %10s %s\n" "$c" "$layout" "$sv" \
        "$(/usr/bin/python3 -c "print(100*$meas)")" "$(/usr/bin/python3 -c "print(100*$pred)")" \
        "$(/usr/bin/python3 -c "print('%.1f / %.1f' % (100*$floor, 100*$pfloor))")" "$tok" \
        "$(/usr/bin/python3 -c "print('%.0f%% bubble, %.2fx tok/s' % (100*$meas/$ref_bubble, $tok/$ref_tok))")$paper" "$note"
    done
    done
  done
done
