"""Full-size standard architectures with random weights, for comparing engines: ResNet-50,
MobileNetV3-Large, EfficientNet-B0, ConvNeXt-T, ViT-B/16, BERT-base and GPT-2 small (128
tokens), and Whisper-base's encoder (1,500 frames); and Swin-T, wav2vec2-base (one second of
16 kHz audio), a 12-layer Llama-style decoder (768 wide, grouped-query attention, 128 tokens)
and T5-small's encoder (128 tokens); and VGG-16 with batch norm.

transformers builds every one but MobileNetV3-Large and VGG-16 from its config (no hub
access); those two are written here after their papers (torchvision is not available).
Every model takes batch 1 and fixed shapes, and returns one tensor (logits, or the last hidden
state for BERT, Whisper's encoder, wav2vec2, the Llama-style decoder and T5's encoder).

    module, inputs = build("vit_b16")
    path = export("vit_b16", "models/")      # models/vit_b16.onnx, opset 17
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

SEED = 0
TOKENS = 128


class _Logits(nn.Module):
    """A transformers model called with keyword inputs, returning its first output only."""

    def __init__(self, model: nn.Module, names: tuple[str, ...]):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *args):
        return self.model(**dict(zip(self.names, args)), return_dict=False)[0]


def _hf(model_class: str, config_class: str, names: tuple[str, ...], **config) -> nn.Module:
    import transformers
    config = getattr(transformers, config_class)(**config)
    return _Logits(getattr(transformers, model_class)(config), names)


class _SqueezeExcite(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        reduced = _round8(channels // 4)
        self.reduce, self.expand = nn.Conv2d(channels, reduced, 1), nn.Conv2d(reduced, channels, 1)

    def forward(self, x):
        s = F.relu(self.reduce(F.adaptive_avg_pool2d(x, 1)))
        return x * F.hardsigmoid(self.expand(s))


def _round8(channels: int) -> int:
    return max(8, int(channels + 4) // 8 * 8)


def _conv_bn(cin: int, cout: int, kernel: int, stride: int, groups: int, act) -> list[nn.Module]:
    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    return layers + ([act()] if act else [])


class _Bneck(nn.Module):
    def __init__(self, cin, kernel, expanded, cout, se, act, stride):
        super().__init__()
        layers = [] if expanded == cin else _conv_bn(cin, expanded, 1, 1, 1, act)
        layers += _conv_bn(expanded, expanded, kernel, stride, expanded, act)
        layers += [_SqueezeExcite(expanded)] if se else []
        layers += _conv_bn(expanded, cout, 1, 1, 1, None)
        self.body, self.residual = nn.Sequential(*layers), stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV3Large(nn.Module):
    """MobileNetV3-Large (Howard et al. 2019, table 1), 1.0 width, 224x224, 1,000 classes."""

    # input channels, kernel, expanded, output channels, squeeze-excite, hardswish, stride
    BLOCKS = [(16, 3, 16, 16, False, False, 1), (16, 3, 64, 24, False, False, 2),
              (24, 3, 72, 24, False, False, 1), (24, 5, 72, 40, True, False, 2),
              (40, 5, 120, 40, True, False, 1), (40, 5, 120, 40, True, False, 1),
              (40, 3, 240, 80, False, True, 2), (80, 3, 200, 80, False, True, 1),
              (80, 3, 184, 80, False, True, 1), (80, 3, 184, 80, False, True, 1),
              (80, 3, 480, 112, True, True, 1), (112, 3, 672, 112, True, True, 1),
              (112, 5, 672, 160, True, True, 2), (160, 5, 960, 160, True, True, 1),
              (160, 5, 960, 160, True, True, 1)]

    def __init__(self, classes: int = 1000):
        super().__init__()
        layers = _conv_bn(3, 16, 3, 2, 1, nn.Hardswish)
        for cin, kernel, expanded, cout, se, hardswish, stride in self.BLOCKS:
            act = nn.Hardswish if hardswish else nn.ReLU
            layers.append(_Bneck(cin, kernel, expanded, cout, se, act, stride))
        layers += _conv_bn(160, 960, 1, 1, 1, nn.Hardswish)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(960, 1280), nn.Hardswish(),
                                        nn.Linear(1280, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class VGG16BN(nn.Module):
    """VGG-16 with batch norm (Simonyan and Zisserman 2014, configuration D; batch norm after
    each conv as torchvision's vgg16_bn): thirteen 3x3 convs of 64 to 512 channels in five
    stages (224, 112, 56, 28 and 14 pixels) with max pools between them, then three fully
    connected layers (25,088 -> 4,096 -> 4,096 -> 1,000): 138 M weights, 102 M of them in the
    first."""

    STAGES = [(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)]

    def __init__(self, classes: int = 1000):
        super().__init__()
        layers, cin = [], 3
        for cout, convs in self.STAGES:
            for _ in range(convs):
                layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]
                cin = cout
            layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(512 * 7 * 7, 4096), nn.ReLU(), nn.Dropout(),
                                        nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout(),
                                        nn.Linear(4096, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


def _image(size: int = 224) -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 3, size, size),)


def _tokens(vocab: int) -> tuple[torch.Tensor, ...]:
    """Token ids and an all-ones attention mask (transformers' GPT-2 exports its mask logic
    through an op ONNX lacks when no mask is given)."""
    ids = torch.randint(0, vocab, (1, TOKENS), dtype=torch.int64)
    return ids, torch.ones(1, TOKENS, dtype=torch.int64)


def _whisper_encoder() -> nn.Module:
    import transformers
    config = transformers.WhisperConfig(d_model=512, encoder_layers=6, encoder_attention_heads=8,
                                        decoder_layers=6, decoder_attention_heads=8,
                                        encoder_ffn_dim=2048, decoder_ffn_dim=2048)
    return _Logits(transformers.WhisperModel(config).get_encoder(), ("input_features",))


# name -> (builder, example inputs, input names)
MODELS = {
    "resnet50": (lambda: _hf("ResNetForImageClassification", "ResNetConfig", ("pixel_values",),
                             num_labels=1000), _image, ("pixel_values",)),
    "mobilenetv3_large": (MobileNetV3Large, _image, ("input",)),
    "efficientnet_b0": (lambda: _hf("EfficientNetForImageClassification", "EfficientNetConfig",
                                    ("pixel_values",), width_coefficient=1.0,
                                    depth_coefficient=1.0, image_size=224, dropout_rate=0.2,
                                    hidden_dim=1280,
                                    num_labels=1000), _image, ("pixel_values",)),
    "convnext_t": (lambda: _hf("ConvNextForImageClassification", "ConvNextConfig",
                               ("pixel_values",), num_labels=1000), _image, ("pixel_values",)),
    "vit_b16": (lambda: _hf("ViTForImageClassification", "ViTConfig", ("pixel_values",),
                            num_labels=1000), _image, ("pixel_values",)),
    "bert_base": (lambda: _hf("BertModel", "BertConfig", ("input_ids", "attention_mask")),
                  lambda: _tokens(30522), ("input_ids", "attention_mask")),
    "gpt2": (lambda: _hf("GPT2LMHeadModel", "GPT2Config", ("input_ids", "attention_mask"),
                         use_cache=False),
             lambda: _tokens(50257), ("input_ids", "attention_mask")),
    "whisper_base_encoder": (_whisper_encoder, lambda: (torch.randn(1, 80, 3000),),
                             ("input_features",)),
    # architecture kinds the table above lacks: windowed attention, an audio encoder with a
    # strided conv front end and a grouped positional conv, a decoder with rotary positions,
    # RMSNorm and grouped-query attention, relative position bias
    "swin_t": (lambda: _hf("SwinForImageClassification", "SwinConfig", ("pixel_values",),
                           num_labels=1000), _image, ("pixel_values",)),
    "wav2vec2_base": (lambda: _hf("Wav2Vec2Model", "Wav2Vec2Config", ("input_values",)),
                      lambda: (torch.randn(1, 16000),), ("input_values",)),
    "llama_small": (lambda: _hf("LlamaModel", "LlamaConfig", ("input_ids", "attention_mask"),
                                hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                                num_attention_heads=12, num_key_value_heads=4,
                                vocab_size=32000, max_position_embeddings=512),
                    lambda: _tokens(32000), ("input_ids", "attention_mask")),
    "t5_small_encoder": (lambda: _hf("T5EncoderModel", "T5Config",
                                     ("input_ids", "attention_mask")),
                         lambda: _tokens(32128), ("input_ids", "attention_mask")),
    # a plain deep CNN: stacked 3x3 convs at every scale and a weight-bound classifier
    "vgg16_bn": (VGG16BN, _image, ("input",)),
}


def build(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """(module in eval mode, example inputs), weights and inputs from the fixed seed."""
    if name not in MODELS:
        raise ValueError(f"unknown standard model {name!r}; known: {', '.join(MODELS)}")
    builder, example, _ = MODELS[name]
    torch.manual_seed(SEED)
    module = builder().eval()
    for layer in module.modules():
        if isinstance(layer, nn.BatchNorm2d):
            # Trained statistics, not the identity a fresh BatchNorm has.
            layer.running_mean.uniform_(-0.2, 0.2)
            layer.running_var.uniform_(0.5, 1.5)
    return module, example()


def export(name: str, folder: str | Path) -> Path:
    """``folder/name.onnx`` (kept if present), exported by torch's TorchScript exporter."""
    path = Path(folder) / f"{name}.onnx"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    module, inputs = build(name)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, inputs, str(path), input_names=list(MODELS[name][2]),
                          output_names=["output"], opset_version=17, dynamo=False)
    return path
