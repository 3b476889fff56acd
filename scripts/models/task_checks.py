"""How the task models' outputs are judged against ONNX Runtime's (numpy only: the CI runner
tests/models/run_task_tests.py, scripts/models/task_status.py and bench/tasks.py share it).

Dense outputs: relative L2. Detections (a variable number K of them):
  - det_rows(outputs, det) puts either form (torchvision's boxes/scores/labels and the outputs
    with K rows beside them, or one [K, 7] tensor of image, box, score, class rows) into one
    dict of arrays;
  - compare_exact (FP32): the same count as the reference, and every detection, matched to the
    reference's one of the same image and class that it overlaps most, within `rtol` relative in
    each box coordinate (relative to max(|x|, 1) pixel) and in its score; the other per-detection
    outputs (masks, keypoints) compared by relative L2 over the matched rows;
  - compare_matched (FP16): detections matched by image and class with IoU >= `iou`, reporting
    how many of each side matched and which did not (class, score).
"""
import numpy as np


def rel_l2(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    if x.shape != ref.shape:
        return float("inf")
    return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30))


def det_rows(outputs, det):
    """{"image": [K], "boxes": [K, 4], "scores": [K], "labels": [K], "extra": {name: [K, ...]}}."""
    if det["format"] == "rows":
        t = np.asarray(outputs[det["output"]], np.float64).reshape(-1, 7)
        return {"image": t[:, det["image"]].astype(np.int64), "boxes": t[:, det["boxes"]],
                "scores": t[:, det["score"]], "labels": t[:, det["label"]].astype(np.int64), "extra": {}}
    boxes = np.asarray(outputs[det["boxes"]], np.float64).reshape(-1, 4)
    k = len(boxes)
    named = {det["boxes"], det["scores"], det["labels"]}
    return {"image": np.zeros(k, np.int64), "boxes": boxes,
            "scores": np.asarray(outputs[det["scores"]], np.float64).reshape(k),
            "labels": np.asarray(outputs[det["labels"]]).astype(np.int64).reshape(k),
            "extra": {n: np.asarray(v) for n, v in outputs.items() if n not in named}}


def iou(a, b):
    """IoU of box a [4] against boxes b [M, 4] (x1, y1, x2, y2)."""
    x1, y1 = np.maximum(a[0], b[:, 0]), np.maximum(a[1], b[:, 1])
    x2, y2 = np.minimum(a[2], b[:, 2]), np.minimum(a[3], b[:, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = lambda x: np.clip(x[..., 2] - x[..., 0], 0, None) * np.clip(x[..., 3] - x[..., 1], 0, None)  # noqa: E731
    return inter / np.maximum(area(a) + area(b) - inter, 1e-12)


def match(ref, got, iou_min):
    """Greedy matching, the reference's detections by falling score: each takes the unmatched
    detection of `got` with the same image and class that overlaps it most, if IoU >= iou_min.
    Returns (pairs [(ref index, got index)], unmatched ref indices, unmatched got indices)."""
    used = np.zeros(len(got["scores"]), bool)
    pairs, lost = [], []
    for i in np.argsort(-ref["scores"], kind="stable"):
        cand = np.nonzero(~used & (got["labels"] == ref["labels"][i]) & (got["image"] == ref["image"][i]))[0]
        if len(cand):
            o = iou(ref["boxes"][i], got["boxes"][cand])
            j = int(np.argmax(o))
            if o[j] >= iou_min:
                used[cand[j]] = True
                pairs.append((int(i), int(cand[j])))
                continue
        lost.append(int(i))
    return pairs, lost, [int(j) for j in np.nonzero(~used)[0]]


def compare_exact(ref, got, rtol=1e-3):
    """FP32: {"ok", "count", "count_ref", "box_rel", "score_rel", "extra_rel_l2": {name: e}, "why"}."""
    r = {"count": len(got["scores"]), "count_ref": len(ref["scores"]), "box_rel": 0.0, "score_rel": 0.0,
         "extra_rel_l2": {}}
    if r["count"] != r["count_ref"]:
        r.update(ok=False, why=f"{r['count']} detections, ONNX Runtime {r['count_ref']}")
        return r
    pairs, lost, extra = match(ref, got, 0.5)
    if lost or extra:
        r.update(ok=False, why=f"{len(lost)} of ONNX Runtime's detections have no counterpart (class, IoU >= 0.5)")
        return r
    if pairs:
        i, j = np.array(pairs).T
        rb, gb = ref["boxes"][i], got["boxes"][j]
        r["box_rel"] = float(np.max(np.abs(gb - rb) / np.maximum(np.abs(rb), 1.0)))
        r["score_rel"] = float(np.max(np.abs(got["scores"][j] - ref["scores"][i]) /
                                      np.maximum(np.abs(ref["scores"][i]), 1e-6)))
        for name, v in ref["extra"].items():
            if name in got["extra"]:
                r["extra_rel_l2"][name] = rel_l2(got["extra"][name][j], v[i])
    bad = [n for n, e in r["extra_rel_l2"].items() if e > 10 * rtol]
    r["ok"] = r["box_rel"] <= rtol and r["score_rel"] <= rtol and not bad
    if not r["ok"]:
        r["why"] = (f"box rel {r['box_rel']:.1e}, score rel {r['score_rel']:.1e}"
                    + (f", {', '.join(bad)} rel L2 over {10 * rtol:g}" if bad else ""))
    return r


def compare_matched(ref, got, iou_min=0.9, show=5):
    """FP16: {"count", "count_ref", "matched", "unmatched_ref": [(class, score)], "unmatched": [...]}."""
    pairs, lost, extra = match(ref, got, iou_min)
    fmt = lambda d, idx: [(int(d["labels"][k]), round(float(d["scores"][k]), 4))  # noqa: E731
                          for k in sorted(idx, key=lambda k: -d["scores"][k])[:show]]
    return {"count": len(got["scores"]), "count_ref": len(ref["scores"]), "matched": len(pairs),
            "unmatched_ref": fmt(ref, lost), "unmatched": fmt(got, extra),
            "n_unmatched_ref": len(lost), "n_unmatched": len(extra)}


def summary_matched(r):
    s = f"{r['matched']}/{r['count_ref']} matched (IoU>=0.9, class)"
    if r["n_unmatched_ref"] or r["n_unmatched"]:
        s += (f"; {r['n_unmatched_ref']} of the reference's lost, e.g. (class, score) {r['unmatched_ref']}"
              f"; {r['n_unmatched']} extra")
    return s
