"""Quality against a reference: PSNR and SSIM of decoded video, the SNR of a soundtrack, in torch (any device).

Frames are floats in [0, 1] (data_range 1), shaped (..., C, H, W); every (frame, channel) image is
scored on its own and the scores averaged. SSIM is Wang et al. 2004 with the usual constants: an 11x11
Gaussian window (sigma 1.5, shrunk to the image when it is smaller; odd size), K1 = 0.01, K2 = 0.03,
statistics over valid windows only (no padding), the window applied as two separable 1-D passes in
float64 (the means of near-equal frames cancel; float64 keeps SSIM of identical frames exactly 1).
Images are scored in chunks so a 124-frame 768x1344 clip needs little memory beyond the frames.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

K1, K2, WINDOW, SIGMA = 0.01, 0.03, 11, 1.5
CHUNK = 64  # images per pass


def psnr(x: torch.Tensor, ref: torch.Tensor, data_range: float = 1.0) -> float | None:
    """10 log10(range^2 / MSE) in dB over all elements; None when the frames are identical (MSE 0)."""
    if x.shape != ref.shape:
        raise ValueError(f"psnr: shapes differ {tuple(x.shape)} vs {tuple(ref.shape)}")
    mse = (x.double() - ref.double()).pow(2).mean().item()
    return None if mse == 0 else 10.0 * math.log10(data_range ** 2 / mse)


def _window(n: int, device) -> torch.Tensor:
    g = torch.arange(n, dtype=torch.float64, device=device) - (n - 1) / 2
    w = torch.exp(-(g ** 2) / (2 * SIGMA ** 2))
    return w / w.sum()


def _blur(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # x: (N, 1, H, W); separable valid-window Gaussian
    n = w.numel()
    x = F.conv2d(x, w.view(1, 1, n, 1))
    return F.conv2d(x, w.view(1, 1, 1, n))


def ssim(x: torch.Tensor, ref: torch.Tensor, data_range: float = 1.0) -> float:
    """Mean SSIM over every (frame, channel) image of x against ref, both (..., C, H, W)."""
    if x.shape != ref.shape:
        raise ValueError(f"ssim: shapes differ {tuple(x.shape)} vs {tuple(ref.shape)}")
    if x.dim() < 2:
        raise ValueError(f"ssim: need (..., H, W) images, got shape {tuple(x.shape)}")
    H, W = x.shape[-2:]
    n = min(WINDOW, H, W)
    n -= (n + 1) % 2  # odd
    w = _window(n, x.device)
    c1, c2 = (K1 * data_range) ** 2, (K2 * data_range) ** 2
    a, b = x.reshape(-1, 1, H, W), ref.reshape(-1, 1, H, W)
    total, count = 0.0, 0
    for i in range(0, a.shape[0], CHUNK):
        p, q = a[i:i + CHUNK].double(), b[i:i + CHUNK].double()
        mp, mq = _blur(p, w), _blur(q, w)
        vp = _blur(p * p, w) - mp * mp
        vq = _blur(q * q, w) - mq * mq
        cov = _blur(p * q, w) - mp * mq
        s = ((2 * mp * mq + c1) * (2 * cov + c2)) / ((mp * mp + mq * mq + c1) * (vp + vq + c2))
        total += s.mean(dim=(1, 2, 3)).sum().item()
        count += s.shape[0]
    return total / count


def snr_db(x: torch.Tensor, ref: torch.Tensor) -> float | None:
    """Signal-to-noise ratio of x against ref in dB, 10 log10(sum ref^2 / sum (x - ref)^2) over all samples (an audio
    track's); None when identical."""
    if x.shape != ref.shape:
        raise ValueError(f"snr_db: shapes differ {tuple(x.shape)} vs {tuple(ref.shape)}")
    noise = (x.double() - ref.double()).pow(2).sum().item()
    if noise == 0:
        return None
    signal = ref.double().pow(2).sum().item()
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def compare(x: torch.Tensor, ref: torch.Tensor) -> dict:
    """bitwise, PSNR (dB; None: identical), SSIM and max |x - ref| of two frame tensors."""
    same = bool(torch.equal(x, ref))
    return {"bitwise": same, "psnr_db": psnr(x, ref), "ssim": 1.0 if same else ssim(x, ref),
            "max_abs": 0.0 if same else (x.float() - ref.float()).abs().max().item()}
