// .npy reading and writing (NumPy format 1.0-3.0): C order, little-endian, numeric and bool.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>

#include "aotc/model.h"

namespace aotc {
namespace {

namespace ffi = tvm::ffi;
constexpr char kMagic[] = "\x93NUMPY";
constexpr uint32_t kMaxHeader = 1 << 16;

DLDataType FromDescr(const std::string& descr, const std::string& path) {
  if (descr == "|b1") return DLDataType{kDLBool, 8, 1};
  if (descr.size() < 3 || (descr[0] != '<' && descr[0] != '|')) {
    throw Error(path + ": unsupported dtype '" + descr + "' (little-endian numbers and bool only)");
  }
  int bytes = std::atoi(descr.c_str() + 2);
  if (bytes != 1 && bytes != 2 && bytes != 4 && bytes != 8) {
    throw Error(path + ": unsupported dtype '" + descr + "'");
  }
  int bits = bytes * 8;
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

// A shape tuple: "()", "(3,)", "(2, 3)". Anything else (expressions, negative or huge dims) is
// refused: the product of the dims sizes the allocation.
std::vector<int64_t> ParseShape(const std::string& text, const std::string& path) {
  auto bad = [&]() { return Error(path + ": .npy shape " + text + " is not a tuple of sizes"); };
  if (text.size() < 2 || text.front() != '(' || text.back() != ')') throw bad();
  std::vector<int64_t> shape;
  size_t at = 1;
  while (true) {
    while (at < text.size() && text[at] == ' ') ++at;
    if (text[at] == ')') break;
    size_t digits = at;
    while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
    if (digits == at || digits - at > 18) throw bad();
    shape.push_back(std::stoll(text.substr(at, digits - at)));
    at = digits;
    while (at < text.size() && text[at] == ' ') ++at;
    if (text[at] == ',') ++at;
    else if (text[at] != ')') throw bad();
  }
  if (at != text.size() - 1) throw bad();
  return shape;
}

// Bytes of data the header promises: the dims' product times the item size, each step checked
// against 'available' (what the file holds after the header), so it can neither overflow
// nor exceed the file.
size_t DataBytes(const std::vector<int64_t>& shape, DLDataType dtype, uint64_t available,
                 const std::string& path) {
  uint64_t bytes = (dtype.bits + 7) / 8;
  bool empty = false;
  for (int64_t dim : shape) empty = empty || dim == 0;
  if (empty) return 0;
  for (int64_t dim : shape) {
    if (bytes > available / uint64_t(dim)) {
      throw Error(path + ": .npy header promises more data than the file holds (" +
                  std::to_string(available) + " bytes after the header)");
    }
    bytes *= uint64_t(dim);
  }
  return size_t(bytes);
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
  if (header_len > kMaxHeader) {
    throw Error(path + ": .npy header of " + std::to_string(header_len) + " bytes (NumPy writes "
                "at most a few hundred)");
  }
  std::string header(header_len, '\0');
  if (!in.read(header.data(), header_len)) throw Error(path + ": truncated .npy header");
  if (HeaderValue(header, "fortran_order", path) != "False") {
    throw Error(path + ": Fortran-order arrays are not supported; save with np.ascontiguousarray");
  }
  std::string descr = HeaderValue(header, "descr", path);
  std::vector<int64_t> shape = ParseShape(HeaderValue(header, "shape", path), path);
  DLDataType dtype = FromDescr(descr.substr(1, descr.size() - 2), path);
  std::streamoff data_start = in.tellg();
  in.seekg(0, std::ios::end);
  uint64_t available = uint64_t(in.tellg() - data_start);
  in.seekg(data_start);
  size_t bytes = DataBytes(shape, dtype, available, path);
  ffi::Tensor tensor = Empty(shape, dtype);
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
  // Written beside 'path' and renamed over it: a killed run leaves the old file or the new one.
  std::string tmp = path + ".tmp" + std::to_string(getpid());
  std::ofstream out(tmp, std::ios::binary);
  if (!out) throw Error(path + ": cannot write");
  out.write(kMagic, 6);
  out.put(1);
  out.put(0);
  out.put(char(header.size() & 0xff));
  out.put(char(header.size() >> 8));
  out << header;
  out.write(static_cast<const char*>(tensor.data_ptr()),
            ffi::GetDataSize(*tensor.GetDLTensorPtr()));
  out.close();
  if (!out || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(path + ": write failed");
  }
}

}  // namespace aotc
