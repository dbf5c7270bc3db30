#!/usr/bin/env python3
"""Writes a small IDX image-classification set for the CNN example: 16x16
grey images of four shapes (0 horizontal bar, 1 vertical bar, 2 square
outline, 3 diagonal), at random places and sizes, with noise. Plain Python,
deterministic (seed 1).

    python3 tools/make_shapes_idx.py examples/data 1500
"""
import os
import random
import struct
import sys

S = 16


def draw(rng, label):
    img = [[0.0] * S for _ in range(S)]
    n = rng.randint(6, 13)
    r, c = rng.randint(0, S - n), rng.randint(0, S - n)
    w = rng.randint(1, 2)
    for i in range(n):
        for t in range(w):
            if label == 0:
                img[r + t][c + i] = 1.0
            elif label == 1:
                img[r + i][c + t] = 1.0
            elif label == 2:
                img[r][c + i] = img[r + n - 1][c + i] = img[r + i][c] = img[r + i][c + n - 1] = 1.0
            else:
                img[r + i][min(S - 1, c + i + t)] = 1.0
    out = bytearray()
    for y in range(S):
        for x in range(S):
            v = img[y][x] * rng.uniform(0.6, 1.0) + rng.uniform(0.0, 0.25)
            out.append(max(0, min(255, int(v * 255))))
    return out


def main(out_dir, n):
    rng = random.Random(1)
    labels = [rng.randrange(4) for _ in range(n)]
    images = bytearray()
    for lab in labels:
        images += draw(rng, lab)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "shapes-images.idx"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, S, S) + images)
    with open(os.path.join(out_dir, "shapes-labels.idx"), "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(labels))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "examples/data", int(sys.argv[2]) if len(sys.argv) > 2 else 1500)
