"""Inputs for the task models, made with numpy alone (the CI runner has no PyTorch).

scene(h, w, seed): a deterministic "real-looking" RGB image in [0, 1], float32 [3, h, w]: a sky
gradient over ground, a dozen objects (boxes, discs, stripes) of distinct colours with soft
edges and shading, and fine texture noise. Random-weight detectors see edges, flat regions and
objects of several sizes, so their heads give scores that are spread out rather than a uniform
haze; no file is needed (tests/models/tasks and bench/tasks.py make the same image).

video(t, h, w, seed): the scene with its objects moving (float32 [3, t, h, w]).
frames(h, w, seed): two scenes a few pixels apart (optical flow).
tokens(batch, seq, vocab, seed): int64 token ids.
"""
import numpy as np


def _smooth(a, passes=2):
    """A cheap separable box blur (edge-padded), over the last two axes."""
    for _ in range(passes):
        p = np.pad(a, [(0, 0)] * (a.ndim - 2) + [(1, 1), (1, 1)], mode="edge")
        a = (p[..., :-2, 1:-1] + p[..., 1:-1, 1:-1] + p[..., 2:, 1:-1]) / 3.0
        p = np.pad(a, [(0, 0)] * (a.ndim - 2) + [(1, 1), (1, 1)], mode="edge")
        a = (p[..., 1:-1, :-2] + p[..., 1:-1, 1:-1] + p[..., 1:-1, 2:]) / 3.0
    return a


def _objects(rng, n=12):
    objs = []
    for _ in range(n):
        objs.append({
            "kind": rng.choice(["box", "disc", "stripes"]),
            "cy": rng.uniform(0.15, 0.9), "cx": rng.uniform(0.05, 0.95),
            "hh": rng.uniform(0.04, 0.22), "hw": rng.uniform(0.03, 0.2),
            "color": rng.uniform(0.05, 0.95, 3), "shade": rng.uniform(0.2, 0.6),
            "vy": rng.uniform(-0.01, 0.01), "vx": rng.uniform(-0.015, 0.015),
        })
    return objs


def _render(h, w, objs, rng, t=0.0):
    yy, xx = np.meshgrid(np.linspace(0, 1, h, dtype=np.float32), np.linspace(0, 1, w, dtype=np.float32),
                         indexing="ij")
    horizon = 0.45 + 0.05 * np.sin(xx * 6.0)
    sky = np.stack([0.35 + 0.3 * yy, 0.55 + 0.25 * yy, 0.9 - 0.2 * yy])
    ground = np.stack([0.35 + 0.1 * np.sin(xx * 40) * 0.2, 0.42 - 0.2 * (yy - 0.45), 0.25 + 0.0 * yy])
    img = np.where(yy < horizon, sky, ground).astype(np.float32)
    for o in objs:
        cy, cx = o["cy"] + o["vy"] * t, o["cx"] + o["vx"] * t
        dy, dx = (yy - cy) / o["hh"], (xx - cx) / o["hw"]
        if o["kind"] == "disc":
            inside = np.clip((1.0 - np.sqrt(dy * dy + dx * dx)) * 8.0, 0, 1)
        else:
            inside = np.clip((1.0 - np.maximum(np.abs(dy), np.abs(dx))) * 8.0, 0, 1)
        if o["kind"] == "stripes":
            inside = inside * (0.6 + 0.4 * (np.sin(dx * 12.0) > 0))
        light = 1.0 - o["shade"] * np.clip(dy * 0.5 + 0.5, 0, 1)
        col = o["color"][:, None, None] * light[None]
        img = img * (1 - inside[None]) + col * inside[None]
    img = _smooth(img, 1)
    img = img + rng.normal(0, 0.02, img.shape).astype(np.float32)
    return np.clip(img, 0, 1).astype(np.float32)


def scene(h, w, seed=0):
    rng = np.random.default_rng(seed)
    return _render(h, w, _objects(rng), rng)


def scenes(n, h, w, seed=0):
    """n different scenes, float32 [n, 3, h, w]."""
    return np.stack([scene(h, w, seed + i) for i in range(n)])


def video(t, h, w, seed=0):
    rng = np.random.default_rng(seed)
    objs = _objects(rng)
    return np.stack([_render(h, w, objs, rng, float(i)) for i in range(t)], axis=1)


def frames(h, w, seed=0):
    """Two consecutive frames (objects moved by a few pixels), float32 [3, h, w] each, in [-1, 1]
    as torchvision's RAFT transforms make them."""
    rng = np.random.default_rng(seed)
    objs = _objects(rng)
    a, b = _render(h, w, objs, rng, 0.0), _render(h, w, objs, rng, 1.0)
    return a * 2 - 1, b * 2 - 1


def normalize(img):
    """ImageNet mean/std normalization of [..., 3, H, W] (channel axis -3)."""
    mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1)
    std = np.array([0.229, 0.224, 0.225], np.float32).reshape(3, 1, 1)
    return ((img - mean) / std).astype(np.float32)


def tokens(batch, seq, vocab, seed=0):
    return np.random.default_rng(seed).integers(1, vocab, (batch, seq)).astype(np.int64)


def _dims(shape, batch):
    """A spec's shape with "N" (the batch) and "2N" (twice it) filled in."""
    return [batch if d == "N" else 2 * batch if d == "2N" else int(d) for d in shape]


def make(spec, batch=1):
    """The input a spec describes, at `batch` (the specs are what scripts/models/tasks.py's
    models and tests/models/tasks/manifest.json hold):
      {"recipe": "scene", "shape": [3, H, W]}            one image in [0, 1]
      {"recipe": "scenes", "shape": ["N", 3, H, W], "normalize": bool}
      {"recipe": "clips", "shape": ["N", 3, T, H, W]}    Kinetics-normalized video clips
      {"recipe": "frames", "shape": ["N", 3, H, W], "which": 0 | 1}  a pair's first or second frame
      {"recipe": "normal", "shape": [...]}               standard normal float32
      {"recipe": "tokens", "shape": ["N", T], "vocab": V, "dtype": "int64"}
      {"recipe": "clip_ids", "shape": ["N", T], "vocab": V}  CLIP tokenizer-like ids, int32
      {"recipe": "const", "value": [...], "dtype": "int64"}
    Each is seeded by spec.get("seed", 0) and the batch, so batch b is the same everywhere."""
    r, seed = spec["recipe"], spec.get("seed", 0) + batch
    if r == "const":
        return np.array(spec["value"], spec.get("dtype", "float32"))
    shape = _dims(spec["shape"], batch)
    if r == "scene":
        return scene(shape[1], shape[2], seed=spec.get("seed", 0))
    if r == "scenes":
        x = scenes(shape[0], shape[2], shape[3], seed=spec.get("seed", 0))
        return normalize(x) if spec.get("normalize") else x
    if r == "clips":
        v = np.stack([video(shape[2], shape[3], shape[4], spec.get("seed", 0) + i) for i in range(shape[0])])
        mean = np.array([0.43216, 0.394666, 0.37645], np.float32).reshape(3, 1, 1, 1)
        std = np.array([0.22803, 0.22145, 0.216989], np.float32).reshape(3, 1, 1, 1)
        return ((v - mean) / std).astype(np.float32)
    if r == "frames":
        return np.stack([frames(shape[2], shape[3], seed=spec.get("seed", 0) + i)[spec["which"]]
                         for i in range(shape[0])])
    rng = np.random.default_rng(seed)
    if r == "normal":
        return rng.standard_normal(shape).astype(np.float32)
    if r == "tokens":
        return rng.integers(1, spec["vocab"], shape).astype(spec.get("dtype", "int64"))
    if r == "clip_ids":
        # As CLIP's tokenizer pads a prompt: start token, words, end token, then end tokens (SD
        # 1.5's padding) to the length; eos_token_id 2 makes the pooler take the argmax.
        vocab = spec["vocab"]
        ids = np.full(shape, vocab - 1, np.int32)
        for i in range(shape[0]):
            n = int(rng.integers(3, shape[1] - 2))
            ids[i, 0] = vocab - 2
            ids[i, 1:1 + n] = rng.integers(1, vocab - 2, n)
        return ids
    raise ValueError(f"unknown input recipe {r!r}")


def feeds(specs, batch=1):
    return {name: make(spec, batch) for name, spec in specs.items()}
