// .npy reading and writing (NumPy format 1.0-3.0): C order, little-endian, numeric and bool.
#include <cstring>
#include <fstream>

#include "aotc/model.h"

namespace aotc {
namespace {

namespace ffi = tvm::ffi;
constexpr char kMagic[] = "\x93NUMPY";

DLDataType FromDescr(const std::string& descr, const std::string& path) {
  if (descr == "|b1") return DLDataType{kDLBool, 8, 1};
  if (descr.size() < 3 || (descr[0] != '<' && descr[0] != '|')) {
    throw Error(path + ": unsupported dtype '" + descr + "' (little-endian numbers and bool only)");
  }
  int bits = std::atoi(descr.c_str() + 2) * 8;
  switch (descr[1]) {
    case 'f': return DLDataType{kDLFloat, uint8_t(bits), 1};
    case 'i': return DLDataType{kDLInt, uint8_t(bits), 1};
    case 'u': return DLDataType{kDLUInt, uint8_t(bits), 1};
    default: throw Error(path + ": unsupported dtype '" + descr + "'");
  }
}

std::string ToDescr(DLDataType dtype) {
  if (dtype.code == kDLBool) return "|b1";
  char kind = dtype.code == kDLFloat ? 'f' : dtype.code == kDLInt ? 'i' : 'u';
  if (dtype.lanes != 1 || (dtype.code != kDLFloat && dtype.code != kDLInt && dtype.code != kDLUInt)) {
    throw Error("cannot write dtype " + DTypeName(dtype) + " as .npy");
  }
  return std::string(dtype.bits == 8 ? "|" : "<") + kind + std::to_string(dtype.bits / 8);
}

// The value of 'key' in the header dict: "'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), "
std::string HeaderValue(const std::string& header, const std::string& key, const std::string& path) {
  size_t at = header.find("'" + key + "'");
  if (at == std::string::npos) throw Error(path + ": .npy header has no '" + key + "'");
  at = header.find(':', at) + 1;
  while (header[at] == ' ') ++at;
  size_t end = header[at] == '(' ? header.find(')', at) + 1
               : header[at] == '\'' ? header.find('\'', at + 1) + 1
                                    : header.find(',', at);
  return header.substr(at, end - at);
}

std::vector<int64_t> ParseShape(const std::string& text) {
  std::vector<int64_t> shape;
  const char* p = text.c_str() + 1;  // past '('
  while (*p && *p != ')') {
    char* next;
    long long dim = std::strtoll(p, &next, 10);
    if (next == p) { ++p; continue; }
    shape.push_back(dim);
    p = next;
  }
  return shape;
}

}  // namespace

ffi::Tensor ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": no such file or not readable");
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, kMagic, 6) != 0) throw Error(path + ": not a .npy file");
  uint32_t header_len = 0;
  unsigned char len[4] = {0, 0, 0, 0};
  in.read(reinterpret_cast<char*>(len), magic[6] == 1 ? 2 : 4);
  header_len = len[0] | (len[1] << 8) | (len[2] << 16) | (uint32_t(len[3]) << 24);
  std::string header(header_len, '\0');
  in.read(header.data(), header_len);
  if (HeaderValue(header, "fortran_order", path) != "False") {
    throw Error(path + ": Fortran-order arrays are not supported; save with np.ascontiguousarray");
  }
  std::string descr = HeaderValue(header, "descr", path);
  ffi::Tensor tensor = Empty(ParseShape(HeaderValue(header, "shape", path)),
                             FromDescr(descr.substr(1, descr.size() - 2), path));
  size_t bytes = ffi::GetDataSize(*tensor.GetDLTensorPtr());
  if (!in.read(static_cast<char*>(tensor.data_ptr()), bytes)) {
    throw Error(path + ": truncated (expected " + std::to_string(bytes) + " bytes of data)");
  }
  return tensor;
}

void WriteNpy(const std::string& path, const ffi::Tensor& tensor) {
  std::string shape;  // a Python tuple: (2, 3), (3,) or ()
  for (int64_t dim : tensor.shape()) shape += (shape.empty() ? "" : ", ") + std::to_string(dim);
  shape = "(" + shape + (tensor.shape().size() == 1 ? ",)" : ")");
  std::string header = "{'descr': '" + ToDescr(tensor.dtype()) +
                       "', 'fortran_order': False, 'shape': " + shape + ", }";
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) throw Error(path + ": cannot write");
  out.write(kMagic, 6);
  out.put(1);
  out.put(0);
  out.put(char(header.size() & 0xff));
  out.put(char(header.size() >> 8));
  out << header;
  out.write(static_cast<const char*>(tensor.data_ptr()),
            ffi::GetDataSize(*tensor.GetDLTensorPtr()));
  if (!out) throw Error(path + ": write failed");
}

}  // namespace aotc
