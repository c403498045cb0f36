// aotc-run: run an aotc model without Python. Same flags as `aotc run`, plus timing:
//   aotc-run model.so [--input NAME=FILE.npy ...] [--output-dir DIR] [--runs N] [--warmup N]
//            [--key-file KEY] [--no-verify]
// An encrypted model takes its key from --key-file, AOTC_MODEL_KEY or AOTC_MODEL_KEY_FILE.
// Inputs not given are random (floats normal, integers in [0, 2), symbolic dims 1).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>
#include <string>

#include "aotc/model.h"

namespace {

namespace ffi = tvm::ffi;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string model;
  std::map<std::string, std::string> inputs;  // name -> .npy path
  std::string output_dir;
  int runs = 1;
  int warmup = 0;
  bool verify = true;
  std::string key_file;
};

[[noreturn]] void Usage(const std::string& problem) {
  std::cerr << "aotc-run: " << problem << "\nusage: aotc-run MODEL.so [--input NAME=FILE.npy ...] "
               "[--output-dir DIR] [--runs N] [--warmup N] [--key-file KEY] [--no-verify]\n";
  std::exit(2);
}

int Count(const char* text, const char* flag) {
  char* end;
  long value = std::strtol(text, &end, 10);
  if (*end || value < 0) Usage(std::string(flag) + " takes a count, got '" + text + "'");
  return static_cast<int>(value);
}

Options Parse(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) Usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--input") {
      std::string item = value();
      size_t eq = item.find('=');
      if (eq == std::string::npos) Usage("--input takes NAME=FILE.npy, got '" + item + "'");
      opt.inputs[item.substr(0, eq)] = item.substr(eq + 1);
    } else if (arg == "--output-dir") {
      opt.output_dir = value();
    } else if (arg == "--runs") {
      opt.runs = std::max(1, Count(value(), "--runs"));
    } else if (arg == "--warmup") {
      opt.warmup = Count(value(), "--warmup");
    } else if (arg == "--key-file") {
      opt.key_file = value();
    } else if (arg == "--no-verify") {
      opt.verify = false;
    } else if (arg == "-h" || arg == "--help") {
      Usage("runs an aotc-compiled model");
    } else if (arg.rfind("--", 0) == 0 || !opt.model.empty()) {
      Usage("unexpected argument '" + arg + "'");
    } else {
      opt.model = arg;
    }
  }
  if (opt.model.empty()) Usage("no model given");
  return opt;
}

template <typename T>
void Fill(ffi::Tensor& tensor, std::mt19937& rng, bool integer) {
  T* data = static_cast<T*>(tensor.data_ptr());
  std::normal_distribution<double> normal;
  std::uniform_int_distribution<int> bit(0, 1);
  for (int64_t i = 0; i < tensor.numel(); ++i) data[i] = integer ? T(bit(rng)) : T(normal(rng));
}

ffi::Tensor RandomInput(const aotc::TensorSpec& spec, std::mt19937& rng) {
  std::vector<int64_t> shape;
  for (int64_t dim : spec.shape) shape.push_back(dim < 0 ? 1 : dim);
  DLDataType dtype = ffi::StringToDLDataType(spec.dtype);
  ffi::Tensor tensor = aotc::Empty(shape, dtype);
  bool integer = dtype.code != kDLFloat;
  switch (dtype.bits) {
    case 8: Fill<int8_t>(tensor, rng, true); break;
    case 16: Fill<int16_t>(tensor, rng, true); break;
    case 32: integer ? Fill<int32_t>(tensor, rng, true) : Fill<float>(tensor, rng, false); break;
    case 64: integer ? Fill<int64_t>(tensor, rng, true) : Fill<double>(tensor, rng, false); break;
    default: throw aotc::Error("input '" + spec.name + "': give it with --input (dtype " +
                               spec.dtype + " has no random fill)");
  }
  return tensor;
}

std::vector<ffi::Tensor> Inputs(const aotc::Metadata& meta, const Options& opt) {
  std::mt19937 rng(0);
  std::vector<ffi::Tensor> inputs;
  for (const auto& [name, path] : opt.inputs) {
    bool known = std::any_of(meta.inputs.begin(), meta.inputs.end(),
                             [&](const aotc::TensorSpec& s) { return s.name == name; });
    if (!known) throw aotc::Error("--input " + name + ": the model has no input of that name");
  }
  for (const aotc::TensorSpec& spec : meta.inputs) {
    auto given = opt.inputs.find(spec.name);
    inputs.push_back(given != opt.inputs.end() ? aotc::ReadNpy(given->second)
                                               : RandomInput(spec, rng));
  }
  return inputs;
}

double AsDouble(const ffi::Tensor& t, int64_t i) {
  const void* p = t.data_ptr();
  DLDataType d = t.dtype();
  if (d.code == kDLFloat) {
    return d.bits == 64 ? static_cast<const double*>(p)[i]
                        : d.bits == 32 ? static_cast<const float*>(p)[i] : 0.0;
  }
  switch (d.bits) {
    case 8: return d.code == kDLInt ? static_cast<const int8_t*>(p)[i] : static_cast<const uint8_t*>(p)[i];
    case 16: return static_cast<const int16_t*>(p)[i];
    case 32: return static_cast<const int32_t*>(p)[i];
    default: return double(static_cast<const int64_t*>(p)[i]);
  }
}

std::string Safe(const std::string& name) {
  std::string out = name;
  for (char& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && !std::strchr("-_.", c)) c = '_';
  }
  return out;
}

void Report(const aotc::Metadata& meta, const std::vector<ffi::Tensor>& outputs,
            const std::string& output_dir) {
  if (!output_dir.empty()) std::filesystem::create_directories(output_dir);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const ffi::Tensor& out = outputs[i];
    std::string name = i < meta.outputs.size() ? meta.outputs[i].name : "output" + std::to_string(i);
    double sum = 0, lo = 0, hi = 0;
    for (int64_t k = 0; k < out.numel(); ++k) {
      double v = AsDouble(out, k);
      sum += v;
      lo = k ? std::min(lo, v) : v;
      hi = k ? std::max(hi, v) : v;
    }
    std::string shape;
    for (int64_t dim : out.shape()) shape += (shape.empty() ? "" : ",") + std::to_string(dim);
    std::printf("%s: %s[%s] mean=%.6g min=%.6g max=%.6g\n", name.c_str(),
                aotc::DTypeName(out.dtype()).c_str(), shape.c_str(),
                out.numel() ? sum / out.numel() : 0.0, lo, hi);
    if (!output_dir.empty()) {
      std::string path = output_dir + "/" + Safe(name) + ".npy";
      aotc::WriteNpy(path, out);
      std::printf("  -> %s\n", path.c_str());
    }
  }
}

double Ms(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void Latency(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  auto pct = [&](double q) { return ms[std::min(ms.size() - 1, size_t(q * (ms.size() - 1) + 0.5))]; };
  std::printf("latency ms over %zu runs: p50 %.3f  p90 %.3f  p99 %.3f  min %.3f\n", ms.size(),
              pct(0.5), pct(0.9), pct(0.99), ms.front());
}

}  // namespace

int main(int argc, char** argv) {
  Options opt = Parse(argc, argv);
  try {
    auto start = Clock::now();
    aotc::Model model(opt.model, opt.verify, opt.key_file);
    std::printf("loaded %s (target %s) in %.1f ms\n", opt.model.c_str(),
                model.metadata().target_name.c_str(), Ms(start));
    std::vector<ffi::Tensor> inputs = Inputs(model.metadata(), opt);
    for (int i = 0; i < opt.warmup; ++i) model.Run(inputs);
    std::vector<double> ms;
    std::vector<ffi::Tensor> outputs;
    for (int i = 0; i < opt.runs; ++i) {
      auto run_start = Clock::now();
      outputs = model.Run(inputs);
      ms.push_back(Ms(run_start));
    }
    Report(model.metadata(), outputs, opt.output_dir);
    Latency(ms);
  } catch (const std::exception& err) {
    std::fprintf(stderr, "aotc-run: %s\n", err.what());
    return 1;
  }
  return 0;
}
