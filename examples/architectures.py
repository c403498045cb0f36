"""Models of the architecture classes the default schedules must hold on, beyond the three
examples: a ViT-style encoder, an EfficientNet-style net, a ConvNeXt-style net, a GPT-style causal
decoder and a small UNet. Written here (torchvision is not available), small enough to compile in
seconds, shaped like the real ones where it matters for kernels: patch-embedding convolutions,
197 tokens and 3 heads; depthwise 5x5 with squeeze-excite, SiLU and hardswish; depthwise 7x7
with LayerNorm over channels and a GELU MLP; causal attention with tanh-GELU; bilinear and
nearest upsampling with skip concatenation."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class ViTBlock(nn.Module):
    """Pre-norm transformer block with nn.MultiheadAttention, as timm's ViT exports."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        y = self.ln1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    """ViT-Tiny shape (patch 16 on 224x224: 196 patches + class token = 197 tokens, width 192,
    3 heads), 4 blocks instead of 12 to keep compile and test time small."""

    def __init__(self, dim: int = 192, heads: int = 3, depth: int = 4, classes: int = 1000):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 16, 16)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, 197, dim) * 0.02)
        self.blocks = nn.Sequential(*[ViTBlock(dim, heads) for _ in range(depth)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.ln(self.blocks(x))[:, 0])


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduced: int):
        super().__init__()
        self.reduce = nn.Conv2d(channels, reduced, 1)
        self.expand = nn.Conv2d(reduced, channels, 1)

    def forward(self, x):
        s = F.silu(self.reduce(x.mean(dim=(2, 3), keepdim=True)))
        return x * torch.sigmoid(self.expand(s))


class MBConv(nn.Module):
    """EfficientNet's inverted bottleneck: 1x1 expand, depthwise k x k, squeeze-excite, 1x1
    project, residual when shapes allow."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expand: int, act):
        super().__init__()
        mid = cin * expand
        self.expand = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), act())
        self.depthwise = nn.Sequential(
            nn.Conv2d(mid, mid, kernel, stride, kernel // 2, groups=mid, bias=False),
            nn.BatchNorm2d(mid), act())
        self.se = SqueezeExcite(mid, max(1, cin // 4))
        self.project = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.project(self.se(self.depthwise(self.expand(x))))
        return x + y if self.residual else y


class EfficientNet(nn.Module):
    """EfficientNet-B0-like stages (3x3 and 5x5 depthwise, SE, SiLU) with hardswish in the last
    stages as MobileNetV3 has; fewer repeats than B0."""

    STAGES = [  # (out channels, kernel, stride, expand, activation)
        (16, 3, 1, 1, nn.SiLU), (24, 3, 2, 6, nn.SiLU), (40, 5, 2, 6, nn.SiLU),
        (80, 3, 2, 6, nn.Hardswish), (112, 5, 1, 6, nn.Hardswish), (192, 5, 2, 6, nn.Hardswish)]

    def __init__(self, classes: int = 1000):
        super().__init__()
        layers = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU()]
        cin = 32
        for cout, kernel, stride, expand, act in self.STAGES:
            layers += [MBConv(cin, cout, kernel, stride, expand, act),
                       MBConv(cout, cout, kernel, 1, expand, act)]
            cin = cout
        layers += [nn.Conv2d(cin, 640, 1, bias=False), nn.BatchNorm2d(640), nn.SiLU()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(640, classes)

    def forward(self, x):
        return self.classifier(self.features(x).mean(dim=(2, 3)))


class ChannelsLayerNorm(nn.Module):
    """LayerNorm over the channel axis of NCHW, as ConvNeXt's downsampling layers use."""

    def __init__(self, channels: int):
        super().__init__()
        self.ln = nn.LayerNorm(channels)

    def forward(self, x):
        return self.ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.ln = nn.LayerNorm(dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.fc2(F.gelu(self.fc1(self.ln(y)))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """ConvNeXt-Tiny widths (96..768) with one block per stage."""

    def __init__(self, dims=(96, 192, 384, 768), classes: int = 1000):
        super().__init__()
        layers = [nn.Conv2d(3, dims[0], 4, 4), ChannelsLayerNorm(dims[0])]
        for i, dim in enumerate(dims):
            if i:
                layers += [ChannelsLayerNorm(dims[i - 1]), nn.Conv2d(dims[i - 1], dim, 2, 2)]
            layers.append(ConvNeXtBlock(dim))
        self.features = nn.Sequential(*layers)
        self.ln = nn.LayerNorm(dims[-1])
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x):
        return self.head(self.ln(self.features(x).mean(dim=(2, 3))))


class DecoderBlock(nn.Module):
    """GPT-2 block: pre-norm, causal self-attention written out, tanh-GELU MLP."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x, mask):
        b, s, d = x.shape
        qkv = self.qkv(self.ln1(x)).reshape(b, s, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5 + mask
        ctx = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(ctx)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPTDecoder(nn.Module):
    """GPT-2-small-like decoder over 128 tokens (width 384, 6 heads, 4 blocks) returning the
    next-token logits of every position; the causal mask is a constant upper triangle."""

    def __init__(self, vocab: int = 4096, seq: int = 128, dim: int = 384, heads: int = 6,
                 depth: int = 4):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Parameter(torch.randn(1, seq, dim) * 0.02)
        self.blocks = nn.ModuleList(DecoderBlock(dim, heads) for _ in range(depth))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), -1e4), diagonal=1))

    def forward(self, input_ids):
        x = self.tok(input_ids) + self.pos
        for block in self.blocks:
            x = block(x, self.mask)
        return self.head(self.ln(x))


def _conv_bn_relu(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU())


class UNet(nn.Module):
    """Three-level UNet on 128x128: max-pool down, bilinear (level 2) and nearest (level 1)
    upsampling, skip connections concatenated on channels, 1x1 head."""

    def __init__(self, cin: int = 3, classes: int = 4, width: int = 32):
        super().__init__()
        w = width
        self.enc1, self.enc2 = _conv_bn_relu(cin, w), _conv_bn_relu(w, 2 * w)
        self.bottom = _conv_bn_relu(2 * w, 4 * w)
        self.dec2, self.dec1 = _conv_bn_relu(6 * w, 2 * w), _conv_bn_relu(3 * w, w)
        self.head = nn.Conv2d(w, classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        b = self.bottom(F.max_pool2d(e2, 2))
        up2 = F.interpolate(b, scale_factor=2.0, mode="bilinear", align_corners=False)
        d2 = self.dec2(torch.cat([up2, e2], dim=1))
        d1 = self.dec1(torch.cat([F.interpolate(d2, scale_factor=2.0, mode="nearest"), e1], dim=1))
        return self.head(d1)


# name -> (constructor, example input factory, ONNX input name)
ARCHITECTURES = {
    "vit": (ViT, lambda: torch.randn(1, 3, 224, 224), "input"),
    "efficientnet": (EfficientNet, lambda: torch.randn(1, 3, 224, 224), "input"),
    "convnext": (ConvNeXt, lambda: torch.randn(1, 3, 224, 224), "input"),
    "gpt": (GPTDecoder, lambda: torch.randint(0, 4096, (1, 128), dtype=torch.int64), "input_ids"),
    "unet": (UNet, lambda: torch.randn(1, 3, 128, 128), "input"),
}
