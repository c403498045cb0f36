"""A pipeline's Python step for tests/test_serve.py (imported by the server process)."""

import numpy as np


def crop_brightest(features: np.ndarray) -> dict:
    """Per row, the 12x12 quadrant of ``features`` [N, C, 24, 24] with the largest sum: the
    crops [N, C, 12, 12] and their top-left corners [N, 2]."""
    crops, corners = [], []
    for row in features:
        quadrants = [(y, x) for y in (0, 12) for x in (0, 12)]
        y, x = max(quadrants, key=lambda q: float(row[:, q[0]:q[0] + 12, q[1]:q[1] + 12].sum()))
        crops.append(row[:, y:y + 12, x:x + 12])
        corners.append((y, x))
    return {"crops": np.ascontiguousarray(np.stack(crops)),
            "corner": np.asarray(corners, dtype=np.int64)}
