#!/usr/bin/env python3
"""Tests of scripts/models/task_checks.py, the rule the task models' detections are judged by
(numpy only): what must pass (rounding of a box coordinate near the image border, flat boxes
clipped at the border, tie-breaks at the cut) and what must still fail (a box or score off by
more than the tolerance, a detection missing above the cut, a list decided by ties, a flat box
moved). Exit status 1 on any failure."""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts", "models"))
import task_checks as tc  # noqa: E402

FAILURES = []


def check(label, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {label}{': ' + detail if detail else ''}")
    if not ok:
        FAILURES.append(label)


def dets(boxes, scores, labels):
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    return {"image": np.zeros(len(boxes), np.int64), "boxes": boxes, "scores": np.asarray(scores, np.float64),
            "labels": np.asarray(labels, np.int64), "extra": {}}


def copy(d, **kw):
    out = {k: (v.copy() if isinstance(v, np.ndarray) else dict(v)) for k, v in d.items()}
    out.update(kw)
    return out


def reference(n=20, seed=0):
    """n detections of 640x480 scenes by falling score, a few touching the left border."""
    rng = np.random.default_rng(seed)
    x1, y1 = rng.uniform(0, 400, n), rng.uniform(0, 300, n)
    x1[:3] = [1.165, 0.43, 0.0]  # near or at the border: x1 = cx - w/2 of a wide box
    boxes = np.stack([x1, y1, x1 + rng.uniform(50, 239, n), y1 + rng.uniform(40, 179, n)], 1)
    return dets(boxes, np.sort(rng.uniform(0.1, 0.7, n))[::-1], rng.integers(1, 5, n))


def exact(ref, got):
    return tc.compare_exact(ref, got)


def main():
    ref = reference()
    r = exact(ref, ref)
    check("identical detections pass", r["ok"] and r["paired"] == 20 and r["box_rel"] == 0, tc.summary_exact(r))

    # Float rounding of a wide box's left edge near x = 1: 2e-3 px is 1.7e-3 of |x1| but 1e-5 of
    # the axis scale max(|x1|, |x2|) (SSDlite's and Faster R-CNN's FP32 differences).
    got = copy(ref)
    got["boxes"][0, 0] += 2e-3
    got["boxes"][1, 1] -= 2e-3
    r = exact(ref, got)
    check("rounding of a coordinate near the border passes (axis scale)", r["ok"], tc.summary_exact(r))
    got["boxes"][0, 0] += 0.6  # 0.6 px of a box ending near x = 240-400: over 1e-3 of the scale
    r = exact(ref, got)
    check("a coordinate 0.6 px off fails", not r["ok"] and "box rel" in r.get("why", ""), r.get("why", ""))

    got = copy(ref)
    got["scores"][5] *= 1 + 2e-3
    r = exact(ref, got)
    check("a score 2e-3 off fails", not r["ok"] and "score rel" in r.get("why", ""), r.get("why", ""))

    # Boxes clipped flat at the border (x1 == x2): IoU 0 with anything, paired by coordinates.
    flat = copy(ref)
    flat["boxes"][4] = [422.66415, 248.71986, 422.66415, 254.40001]
    got = copy(flat)
    got["boxes"][4, 1] -= 1.2e-4
    r = exact(flat, got)
    check("a flat box with rounding pairs and passes (FCOS)", r["ok"] and r["paired"] == 20, tc.summary_exact(r))
    got["boxes"][4, 2] += 1e-4  # flat in the reference only (x2 - x1 rounded apart by 1e-4 px)
    r = exact(flat, got)
    check("a box flat on one side only pairs and passes", r["ok"] and r["paired"] == 20, tc.summary_exact(r))
    r = exact(got, flat)
    check("... and the other way round", r["ok"] and r["paired"] == 20, tc.summary_exact(r))
    got["boxes"][4, [0, 2]] += 10.0
    r = exact(flat, got)
    check("a flat box moved 10 px fails", not r["ok"] and r["paired"] == 19, r.get("why", ""))

    # Tie-breaks at the cut: the last detection swapped for another candidate of nearly the same
    # score (a top-k cut or max detections), or one more candidate at a score threshold.
    got = copy(ref)
    cut = ref["scores"][-1]
    got["boxes"][-1] = [600, 10, 630, 60]
    got["scores"][-1] = cut * (1 + 3e-4)
    r = exact(ref, got)
    check("a different detection at the cut score is a tie-break", r["ok"] and r["tie_breaks"] == (1, 1),
          tc.summary_exact(r))
    more = dets(np.vstack([ref["boxes"], [[500, 300, 560, 380]]]), np.append(ref["scores"], cut * (1 - 2e-4)),
                np.append(ref["labels"], 2))
    r = exact(ref, more)
    check("one more detection at the cut (count 21 vs 20) is a tie-break", r["ok"] and r["count"] == 21,
          tc.summary_exact(r))
    fewer = dets(ref["boxes"][:-1], ref["scores"][:-1], ref["labels"][:-1])
    r = exact(ref, fewer)
    check("the cut's last detection missing is a tie-break", r["ok"] and r["tie_breaks"] == (1, 0), tc.summary_exact(r))

    # What a tie-break does not excuse.
    got = copy(ref)
    got["boxes"][7] = [600, 10, 630, 60]
    r = exact(ref, got)
    check("a detection replaced above the cut fails", not r["ok"] and "not tie-breaks" in r.get("why", ""),
          r.get("why", ""))
    mid = dets(np.delete(ref["boxes"], 7, 0), np.delete(ref["scores"], 7), np.delete(ref["labels"], 7))
    r = exact(ref, mid)
    check("a detection missing above the cut fails (count 19 vs 20)", not r["ok"], r.get("why", ""))
    got = copy(ref)
    got["labels"][-1] = ref["labels"][-1] % 4 + 1
    got["scores"][-1] = cut * 1.01
    r = exact(ref, got)
    check("a detection at the cut with a score 1% off is no tie-break", not r["ok"], r.get("why", ""))
    tied = copy(ref, scores=np.full(20, 0.3))
    shuffled = copy(tied)
    shuffled["boxes"][:6] = shuffled["boxes"][:6] + 200.0
    r = exact(tied, shuffled)
    check("a list decided by ties (6 of 20 at one score differ) fails", not r["ok"], r.get("why", ""))

    # The float64 arbiter: ONNX Runtime 2e-3 off the float64 outputs (Keypoint R-CNN), kiln close.
    f64 = ref
    ort = copy(ref)
    ort["scores"] = ref["scores"] * (1 + 2.1e-3 * np.sign(np.sin(np.arange(20))))
    kiln = copy(ref)
    kiln["scores"] = ref["scores"] * (1 + 3e-4)
    a = tc.arbitrate(ort, kiln, f64)
    check("arbitrate: kiln near float64 passes where ONNX Runtime is off", a["ok"] and not a["ort"]["ok"], a["why"])
    kiln["scores"][3] *= 1.01
    a = tc.arbitrate(ort, kiln, f64)
    check("arbitrate: kiln off float64 fails", not a["ok"], a["why"])

    print("task_checks tests: " + ("all pass" if not FAILURES else f"{len(FAILURES)} FAILED: " + ", ".join(FAILURES)))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
