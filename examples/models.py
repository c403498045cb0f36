"""Example models defined here (torchvision is not available): ResNet-18, MobileNetV2 and a
BERT-style encoder (and, in architectures.py, ViT-, EfficientNet-, ConvNeXt-, GPT-style models and
a UNet). Weights are random from a fixed seed; BatchNorm running statistics are
randomised too so that folding them is not a no-op."""

from __future__ import annotations

import torch
from torch import nn

from .architectures import ARCHITECTURES

SEED = 0


def _randomise_batchnorm(module: nn.Module) -> None:
    """Fresh BatchNorm layers have mean 0 / var 1, which hides layout and folding bugs."""
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.1, 0.1)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.down is None else self.down(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        )
        layers, cin = [], 64
        for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.pool(self.layers(self.stem(x)))
        return self.fc(torch.flatten(x, 1))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden),
                       nn.ReLU6(inplace=True)]
        layers += [
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout),
        ]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    # (expansion, channels, repeats, first stride), as in the paper
    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6(inplace=True)]
        cin = 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers += [nn.Conv2d(cin, 1280, 1, bias=False), nn.BatchNorm2d(1280),
                   nn.ReLU6(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, num_classes)

    def forward(self, x):
        x = self.features(x).mean(dim=(2, 3))
        return self.classifier(x)


class EncoderLayer(nn.Module):
    """Post-norm BERT layer written out (not nn.MultiheadAttention) so that the exported graph
    holds the MatMul/Softmax/LayerNorm ops a real BERT export has."""

    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden)
        self.ff1 = nn.Linear(hidden, ffn)
        self.ff2 = nn.Linear(ffn, hidden)
        self.ln2 = nn.LayerNorm(hidden)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) / self.head_dim ** 0.5, dim=-1)
        ctx = (att @ v).transpose(1, 2).reshape(b, s, h)
        x = self.ln1(x + self.out(ctx))
        return self.ln2(x + self.ff2(torch.nn.functional.gelu(self.ff1(x))))


class BertEncoder(nn.Module):
    def __init__(self, layers: int = 4, hidden: int = 768, heads: int = 12, vocab: int = 2048,
                 seq: int = 128):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Parameter(torch.randn(1, seq, hidden) * 0.02)
        self.ln = nn.LayerNorm(hidden)
        self.layers = nn.ModuleList(EncoderLayer(hidden, heads, 4 * hidden) for _ in range(layers))

    def forward(self, input_ids):
        x = self.ln(self.tok(input_ids) + self.pos)
        for layer in self.layers:
            x = layer(x)
        return x


def build(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Return (model in eval mode, example inputs) with weights from the fixed seed."""
    torch.manual_seed(SEED)
    if name == "resnet18":
        model, inputs = ResNet18(), (torch.randn(1, 3, 224, 224),)
    elif name == "mobilenetv2":
        model, inputs = MobileNetV2(), (torch.randn(1, 3, 224, 224),)
    elif name == "bert":
        model, inputs = BertEncoder(), (torch.randint(0, 2048, (1, 128), dtype=torch.int64),)
    elif name in ARCHITECTURES:
        constructor, example, _ = ARCHITECTURES[name]
        model, inputs = constructor(), (example(),)
    else:
        raise ValueError(f"unknown example model {name!r}; known: {', '.join(MODELS)}")
    _randomise_batchnorm(model)
    return model.eval(), inputs


EXAMPLES = ("resnet18", "mobilenetv2", "bert")
MODELS = EXAMPLES + tuple(ARCHITECTURES)
INPUT_NAMES = {"resnet18": "input", "mobilenetv2": "input", "bert": "input_ids",
               **{name: entry[2] for name, entry in ARCHITECTURES.items()}}
