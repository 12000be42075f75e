"""The heads the demo's readers report by name, chosen by the rules params.yaml states beside them.

The paper names heads of Qwen3-14B (L39H38, L30H11, ...); the demo teacher has its own, so params
`readers.named_heads`, `locus.suffix_leader` and `second_teacher.named_heads` name the demo heads
that play those roles.  A new demo teacher (a retrained world) needs them chosen again, by the same
rules, from the artifacts of a run:

* leader: the smallest sum of ranks over P1, P2 and P2C (HD-001's global rankings);
* contrastive_specialist: the best-ranked P2C head other than the leader;
* recurrent: the heads HD-001's recurrence test finds recurrent (Bonferroni), most notes first;
* direct_path: the two final-layer heads of largest mean exact P2C importance (HD-001's exact patches),
  the contrastive specialist aside (R-D20 reports the three side by side);
* intact_p2: the detached P2 top-4;
* region_readers, prose_readers: of the P1 top-`pool_k`, the 4 with the largest median share on the
  emitted chapter's lines, and on the trace prose, at P1 events (HD-001-read);
* contrastive_readers: of the P2C top-`pool_k`, the 2 with the largest median share on the near-miss's
  earlier mentions at P2C events (HD-001-read);
* locus.suffix_leader: the top of the suffix ranking (HD-001-locus);
* second_teacher: HD-QWQ's P2C ranks 1 and 2.

The read side reads only its panel's heads (each phase's top and bottom, a random draw and the named
heads), so the reader roles need reads of every candidate: `--candidates` prints the params entries
that put the candidates in the panel for one `dvc repro HD-001-read`; run without it afterwards.

    python tools/named_heads.py --candidates   # then set them, dvc repro HD-001-read
    python tools/named_heads.py                # the chosen heads, as params.yaml entries
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import yaml
from scipy.stats import binomtest

from mistill.instrument import read_readout as rr
from mistill.instrument.proxy_readout import ARTIFACT, exact_rows, load_proxy, proxy_faithfulness
from mistill.params import load_params

PHASES = ("P1", "P2", "P2C")


def name(flat: int, n_heads: int) -> str:
    return f"l{flat // n_heads}h{flat % n_heads}"


def ranked(sets: dict, phase: str) -> list[int]:
    """Flat head ids of a phase's global ranking, best first."""
    return [r["layer"] * sets["n_heads"] + r["head"] for r in sets["phases"][phase]]


def ranking_roles(sets: dict, calibration: dict, alpha: float) -> dict[str, object]:
    H = sets["n_heads"]
    rank = {p: {h: i + 1 for i, h in enumerate(ranked(sets, p))} for p in PHASES}
    heads = sorted(rank["P1"])
    leader = min(heads, key=lambda h: (sum(rank[p][h] for p in PHASES), rank["P2C"][h], h))
    specialist = next(h for h in ranked(sets, "P2C") if h != leader)
    rec = calibration["recurrence"]
    counts = np.asarray(rec["counts"])
    p_null = rec["top_k"] / counts.size
    p = np.array([binomtest(int(c), calibration["n_notes"], p_null, alternative="greater").pvalue for c in counts])
    recurrent = sorted(np.flatnonzero(p <= alpha / counts.size), key=lambda h: (-counts[h], h))
    if len(recurrent) != rec["n_recurrent"]:
        raise SystemExit(f"recurrence: {len(recurrent)} heads pass here, HD-001 counted {rec['n_recurrent']}")
    print(f"leader {name(leader, H)}: ranks " + ", ".join(f"{p} {rank[p][leader]}" for p in PHASES), file=sys.stderr)
    print(f"contrastive specialist {name(specialist, H)}: P2C {rank['P2C'][specialist]}, P1 {rank['P1'][specialist]}",
          file=sys.stderr)
    print("recurrent: " + ", ".join(f"{name(h, H)} ({counts[h]} of {calibration['n_notes']} notes)"
                                    for h in recurrent), file=sys.stderr)
    return {"leader": name(leader, H), "contrastive_specialist": name(specialist, H),
            "recurrent": [name(int(h), H) for h in recurrent],
            "intact_p2": [name(h, H) for h in ranked(sets, "P2")[:4]]}


def direct_path(hd: Path, n_layers: int, n_heads: int, specialist: str) -> list[str]:
    proxy_dir = Path(f"{hd}-proxy")
    notes = sorted(p.parent.name for p in proxy_dir.glob(f"*/{ARTIFACT}"))
    summary = proxy_faithfulness({n: exact_rows(hd / n / "patch2.jsonl") for n in notes},
                                 {n: load_proxy(proxy_dir / n / ARTIFACT) for n in notes})
    final = {h: m["exact"] for h, m in summary["head_means"].items()
             if int(h) // n_heads == n_layers - 1 and name(int(h), n_heads) != specialist}
    chosen = sorted(final, key=lambda h: -final[h])[:2]
    print("direct path: " + ", ".join(f"{name(int(h), n_heads)} (exact {final[h]:.3g})" for h in chosen),
          file=sys.stderr)
    return [name(int(h), n_heads) for h in chosen]


def reader_roles(read_dir: Path, sets: dict, k: int) -> dict[str, list[str]] | None:
    H = sets["n_heads"]
    summary, rows = rr.load_reads(read_dir)
    read = {h for group in ("top", "bottom") for hs in summary["panel"][group].values() for h in hs}
    read |= set(summary["panel"]["random"]) | {h for hs in summary["named"].values() for h in hs}
    p1, p2c = ranked(sets, "P1")[:k], ranked(sets, "P2C")[:k]
    missing = sorted(set(p1 + p2c) - read)
    if missing:
        print("no reads of " + ", ".join(name(h, H) for h in missing) + ": run with --candidates first",
              file=sys.stderr)
        return None

    def best(heads, phase, categories, n):
        share = {h: rr.median(rr.share_per_note(rows, phase, h, categories)) for h in heads}
        share = {h: s for h, s in share.items() if s is not None}
        return [name(h, H) for h in sorted(share, key=lambda h: (-share[h], h))[:n]]

    return {"region_readers": best(p1, "P1", rr.REGION, 4), "prose_readers": best(p1, "P1", rr.PROSE, 4),
            "contrastive_readers": best(p2c, "P2C", rr.NEAR_MISS, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", action="store_true",
                        help="print the reader roles that put every candidate head in the read panel")
    args = parser.parse_args()
    params = load_params()
    hd = Path(params["instrument"]["out_dir"])
    sets = json.loads((hd / "head_sets_contrast.json").read_text())
    k = int(params["instrument"]["calibration"]["pool_k"])
    H = sets["n_heads"]
    if args.candidates:
        p1, p2c = ranked(sets, "P1")[:k], ranked(sets, "P2C")[:k]
        print(yaml_block({"region_readers": [name(h, H) for h in p1[: k // 2]],
                          "prose_readers": [name(h, H) for h in p1[k // 2:]],
                          "contrastive_readers": [name(h, H) for h in p2c]}))
        return 0
    calibration = json.loads((hd / "calibration.json").read_text())
    roles = ranking_roles(sets, calibration, float(params["instrument"]["calibration"]["fdr"]))
    roles["direct_path"] = direct_path(hd, sets["n_layers"], H, roles["contrastive_specialist"])
    readers = reader_roles(Path(params["read_side"]["out_dir"]) / "readside", sets, k)
    if readers:
        roles.update(readers)
    locus = json.loads((Path(params["locus"]["out_dir"]) / "head_sets_locus.json").read_text())
    top = locus["phases"]["suffix"][0]
    qwq = json.loads((Path(f"{hd.parent}/HD-QWQ") / "head_sets_contrast.json").read_text())
    p2c = qwq["phases"]["P2C"][:2]
    print(yaml_block({"readers.named_heads": roles, "locus.suffix_leader": f"l{top['layer']}h{top['head']}",
                      "second_teacher.named_heads": {
                          "exact_p2c_top": f"l{p2c[0]['layer']}h{p2c[0]['head']}",
                          "exact_p2c_second": f"l{p2c[1]['layer']}h{p2c[1]['head']}"}}))
    return 0


def yaml_block(entries: dict) -> str:
    """The entries as YAML to paste into params.yaml, short lists in flow style as params.yaml writes them."""
    return yaml.safe_dump(entries, default_flow_style=None, sort_keys=False, width=110).rstrip()


if __name__ == "__main__":
    raise SystemExit(main())
