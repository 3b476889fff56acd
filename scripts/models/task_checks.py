"""How the task models' outputs are judged against ONNX Runtime's (numpy only: the CI runner
tests/models/run_task_tests.py, scripts/models/task_status.py and bench/tasks.py share it).

Dense outputs: relative L2. Detections (a variable number K of them):
  - det_rows(outputs, det) puts either form (torchvision's boxes/scores/labels and the outputs
    with K rows beside them, or one [K, 7] tensor of image, box, score, class rows) into one
    dict of arrays;
  - match: each reference detection (by falling score) pairs with the detection of the same
    image and class that overlaps it most (IoU >= a limit); where either box has zero width or
    height (clipped flat at the image border: its IoU with anything is 0), with the nearest box
    whose every coordinate is within 1% of its axis's scale (box_errors);
  - compare_exact (FP32): every detection paired, each box coordinate within `rtol` of the
    reference's relative to its axis's scale (box_errors: max(|x1|, |x2|, 1) for x1 and x2: box
    decoding makes x1 = cx - w/2, so its float rounding scales with |cx| + w/2, not with |x1|)
    and each score within `rtol` relative; the other per-detection outputs (masks, keypoints)
    compared by relative L2 over the paired rows. Detections left unpaired on either side (the
    counts may differ by them) are allowed only as tie-breaks at a cut: a score within `rtol`
    (relative) of the lowest score of the other list (the cut there: a top-k cut, a score
    threshold or max detections decides by rounding which of nearly equal candidates survive)
    or, in the longer list, of its own lowest (a threshold cut), and at most a
    tenth of the list (at least one: more is a list decided by ties, not a tie-break). Any other
    unpaired detection fails;
  - arbitrate: when kiln and ONNX Runtime differ beyond that, both against a float64 run of the
    same model (PyTorch in float64, independent of kiln's kernels): kiln passes when it is within
    the same rule of the float64 outputs, and the verdict says how far each side is;
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


def box_errors(rb, gb):
    """|gb - rb| per coordinate of boxes [K, 4] (x1, y1, x2, y2), relative to the scale of the
    coordinate's axis in the reference box: max(|x1|, |x2|, 1) for x1 and x2, max(|y1|, |y2|, 1)
    for y1 and y2."""
    rb, gb = np.asarray(rb, np.float64).reshape(-1, 4), np.asarray(gb, np.float64).reshape(-1, 4)
    sx = np.maximum(np.maximum(np.abs(rb[:, 0]), np.abs(rb[:, 2])), 1.0)
    sy = np.maximum(np.maximum(np.abs(rb[:, 1]), np.abs(rb[:, 3])), 1.0)
    return np.abs(gb - rb) / np.stack([sx, sy, sx, sy], 1)


FLAT_CLOSE = 1e-2  # a flat box pairs with a box whose coordinates are this close (box_errors)


def flat(boxes):
    """Boxes [K, 4] of zero width or height (IoU 0 with anything)."""
    boxes = np.asarray(boxes).reshape(-1, 4)
    return (boxes[:, 2] <= boxes[:, 0]) | (boxes[:, 3] <= boxes[:, 1])


def match(ref, got, iou_min):
    """Greedy matching, the reference's detections by falling score: each takes the unmatched
    detection of `got` with the same image and class that overlaps it most, if IoU >= iou_min;
    where the reference box or a candidate is flat (zero width or height: IoU 0 with anything),
    the nearest such candidate whose box_errors are all within FLAT_CLOSE. Returns (pairs [(ref
    index, got index)], unmatched ref indices, unmatched got indices)."""
    used = np.zeros(len(got["scores"]), bool)
    pairs, lost = [], []
    for i in np.argsort(-ref["scores"], kind="stable"):
        cand = np.nonzero(~used & (got["labels"] == ref["labels"][i]) & (got["image"] == ref["image"][i]))[0]
        if len(cand):
            b, cb = ref["boxes"][i], got["boxes"][cand]
            o = iou(b, cb)
            j = int(np.argmax(o))
            ok = o[j] >= iou_min
            near = flat(b[None])[0] | flat(cb)
            if not ok and near.any():
                e = np.where(near, box_errors(np.repeat(b[None], len(cand), 0), cb).max(1), np.inf)
                j = int(np.argmin(e))
                ok = e[j] <= FLAT_CLOSE
            if ok:
                used[cand[j]] = True
                pairs.append((int(i), int(cand[j])))
                continue
        lost.append(int(i))
    return pairs, lost, [int(j) for j in np.nonzero(~used)[0]]


def tie_breaks(d, idx, other, rtol):
    """Of the detections `idx` of list d, those whose score is within rtol (relative) of the
    lowest score of the other list (its cut, where rounding may have kept or dropped them) or,
    when d is the longer list (a score threshold, not a count, made the cut), of d's own lowest."""
    cuts = [float(np.min(x["scores"])) for x in ([other] if len(other["scores"]) else []) +
            ([d] if len(d["scores"]) > len(other["scores"]) else [])]
    return [k for k in idx if any(abs(d["scores"][k] - c) <= rtol * max(abs(c), 1e-6) for c in cuts)]


def compare_exact(ref, got, rtol=1e-3):
    """FP32: {"ok", "count", "count_ref", "paired", "box_rel", "score_rel", "box_abs",
    "tie_breaks": (reference's, got's), "extra_rel_l2": {name: e}, "why"}."""
    r = {"count": len(got["scores"]), "count_ref": len(ref["scores"]), "box_rel": 0.0, "score_rel": 0.0,
         "box_abs": 0.0, "extra_rel_l2": {}}
    pairs, lost, extra = match(ref, got, 0.5)
    r["paired"] = len(pairs)
    tie_ref, tie_got = tie_breaks(ref, lost, got, rtol), tie_breaks(got, extra, ref, rtol)
    r["tie_breaks"] = (len(tie_ref), len(tie_got))
    if pairs:
        i, j = np.array(pairs).T
        rb, gb = ref["boxes"][i], got["boxes"][j]
        r["box_rel"] = float(np.max(box_errors(rb, gb)))
        r["box_abs"] = float(np.max(np.abs(gb - rb)))
        r["score_rel"] = float(np.max(np.abs(got["scores"][j] - ref["scores"][i]) /
                                      np.maximum(np.abs(ref["scores"][i]), 1e-6)))
        for name, v in ref["extra"].items():
            if name in got["extra"]:
                r["extra_rel_l2"][name] = rel_l2(got["extra"][name][j], v[i])
    bad = [n for n, e in r["extra_rel_l2"].items() if e > 10 * rtol]
    untied = (len(lost) - len(tie_ref), len(extra) - len(tie_got))
    if max(r["tie_breaks"]) > max(1, r["count_ref"] // 10):  # a list decided by ties is no tie-break
        untied = (len(lost), len(extra))
    r["ok"] = r["box_rel"] <= rtol and r["score_rel"] <= rtol and not bad and untied == (0, 0)
    if not r["ok"]:
        why = []
        if untied != (0, 0):
            show = [(int(ref["labels"][k]), round(float(ref["scores"][k]), 4))
                    for k in lost if k not in tie_ref][:3]
            why.append(f"{untied[0]} of the reference's and {untied[1]} of kiln's detections unpaired "
                       f"(class, IoU >= 0.5) and not tie-breaks at the cut (score within {rtol:g} of the "
                       f"other side's lowest): e.g. (class, score) {show}")
        if r["box_rel"] > rtol or r["score_rel"] > rtol:
            why.append(f"box rel {r['box_rel']:.1e}, score rel {r['score_rel']:.1e}")
        if bad:
            why.append(f"{', '.join(bad)} rel L2 over {10 * rtol:g}")
        r["why"] = "; ".join(why)
    return r


def summary_exact(r, why=True):
    """One line of compare_exact's result (with why it fails, unless why=False)."""
    s = (f"{r['count']} detections (reference {r['count_ref']}), {r['paired']} paired; box rel {r['box_rel']:.1e} "
         f"({r['box_abs']:.1e} px), score rel {r['score_rel']:.1e}")
    if any(r["tie_breaks"]):
        s += f"; tie-breaks at the cut: {r['tie_breaks'][0]} of the reference's, {r['tie_breaks'][1]} of kiln's"
    return s + ("" if r["ok"] or not why else f": {r['why']}")


def arbitrate(ref, got, f64, rtol=1e-3):
    """kiln (`got`) and ONNX Runtime (`ref`) both against float64 outputs of the same model:
    {"ok": kiln within compare_exact's rule of float64, "kiln": compare_exact(f64, got),
    "ort": compare_exact(f64, ref), "why"}."""
    k, o = compare_exact(f64, got, rtol), compare_exact(f64, ref, rtol)
    why = (f"against float64: kiln box rel {k['box_rel']:.1e}, score rel {k['score_rel']:.1e}"
           f"{'' if k['ok'] else ' (fails: ' + k['why'] + ')'}; ONNX Runtime box rel {o['box_rel']:.1e}, "
           f"score rel {o['score_rel']:.1e}{'' if o['ok'] else ' (outside the rule)'}")
    return {"ok": k["ok"], "kiln": k, "ort": o, "why": why}


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
