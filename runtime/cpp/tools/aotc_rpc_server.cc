// aotc-rpc-server: a TVM RPC server on libtvm_runtime alone (no Python), for device farms whose
// boards have no Python or TVM install (and for ARM boards emulated here under qemu-aarch64).
//   aotc-rpc-server --tracker HOST:PORT --key KEY [--host 127.0.0.1] [--port 9300]
// Speaks TVM's tracker protocol as tvm/rpc/server.py does: register the address, offer a
// one-use match key, serve each accepted session in a forked child (in its own temporary work
// folder, killed when the session's -timeout passes), then offer a new key. Uploaded modules
// must be shared libraries built for this machine (there is no compiler on the board).
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

namespace {

namespace ffi = tvm::ffi;
constexpr int kRpcMagic = 0xff271;
constexpr int kTrackerMagic = 0x2f271;
constexpr int kCodeSuccess = kRpcMagic;
constexpr int kCodeMismatch = kRpcMagic + 2;
enum TrackerCode { kSuccess = 0, kPut = 3, kUpdateInfo = 5, kGetPendingMatchKeys = 7 };
constexpr int kPingSeconds = 2;
constexpr int kUnmatchedSeconds = 6;  // re-offer a key nobody asked for (as server.py)

[[noreturn]] void Fail(const std::string& why) {
  std::fprintf(stderr, "aotc-rpc-server: %s\n", why.c_str());
  std::exit(1);
}

bool SendAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = send(fd, p, size, MSG_NOSIGNAL);
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool RecvAll(int fd, void* data, size_t size) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = recv(fd, p, size, 0);
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool SendInt(int fd, int32_t value) { return SendAll(fd, &value, 4); }

bool RecvInt(int fd, int32_t* value) { return RecvAll(fd, value, 4); }

bool SendJson(int fd, const std::string& json) {
  return SendInt(fd, static_cast<int32_t>(json.size())) && SendAll(fd, json.data(), json.size());
}

bool RecvJson(int fd, ffi::Any* value) {
  int32_t size;
  if (!RecvInt(fd, &size) || size < 0) return false;
  std::string text(static_cast<size_t>(size), '\0');
  if (!RecvAll(fd, text.data(), text.size())) return false;
  *value = ffi::json::Parse(text);
  return true;
}

bool Succeeded(const ffi::Any& reply) {
  auto code = reply.try_cast<int64_t>();
  return code.has_value() && *code == kSuccess;
}

struct Options {
  std::string tracker_host, key, host = "127.0.0.1";
  int tracker_port = 0, port = 9300;
};

Options Parse(int argc, char** argv) {
  Options opt;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--tracker") {
      size_t colon = value.rfind(':');
      if (colon == std::string::npos) Fail("--tracker takes HOST:PORT");
      opt.tracker_host = value.substr(0, colon);
      opt.tracker_port = std::atoi(value.c_str() + colon + 1);
    } else if (flag == "--key") {
      opt.key = value;
    } else if (flag == "--host") {
      opt.host = value;
    } else if (flag == "--port") {
      opt.port = std::atoi(value.c_str());
    } else {
      Fail("unknown flag " + flag);
    }
  }
  if (opt.tracker_host.empty() || opt.key.empty()) {
    Fail("usage: aotc-rpc-server --tracker HOST:PORT --key KEY [--host H] [--port P]");
  }
  return opt;
}

int Listen(const Options& opt, int* port) {
  for (int candidate = opt.port; candidate < opt.port + 100; ++candidate) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(candidate));
    inet_pton(AF_INET, opt.host.c_str(), &addr.sin_addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && listen(fd, 4) == 0) {
      *port = candidate;
      return fd;
    }
    close(fd);
  }
  Fail("no free port in [" + std::to_string(opt.port) + ", +100)");
}

int ConnectTracker(const Options& opt, int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(opt.tracker_port));
  inet_pton(AF_INET, opt.tracker_host.c_str(), &addr.sin_addr);
  int32_t magic = 0;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      !SendInt(fd, kTrackerMagic) || !RecvInt(fd, &magic) || magic != kTrackerMagic) {
    close(fd);
    return -1;
  }
  ffi::Any reply;
  std::string info = "[" + std::to_string(kUpdateInfo) + ", {\"key\": \"server:" + opt.key +
                     "\", \"addr\": [\"" + opt.host + "\", " + std::to_string(port) + "]}]";
  if (!SendJson(fd, info) || !RecvJson(fd, &reply) || !Succeeded(reply)) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string NewMatchKey(const std::string& key) {
  static std::mt19937 rng(std::random_device{}());
  return key + ":" + std::to_string(rng() % 100000000);
}

bool Offer(int tracker, const Options& opt, int port, const std::string& match) {
  ffi::Any reply;
  std::string put = "[" + std::to_string(kPut) + ", \"" + opt.key + "\", [" +
                    std::to_string(port) + ", \"" + match + "\"], \"" + opt.host + "\"]";
  return SendJson(tracker, put) && RecvJson(tracker, &reply) && Succeeded(reply);
}

// Whether the tracker still holds a request for ``match`` (false: nobody asked lately).
bool Pending(int tracker, const std::string& match, bool* ok) {
  ffi::Any reply;
  *ok = SendJson(tracker, "[" + std::to_string(kGetPendingMatchKeys) + "]") &&
        RecvJson(tracker, &reply);
  if (!*ok) return false;
  for (const ffi::Any& item : reply.cast<ffi::Array<ffi::Any>>()) {
    if (item.try_cast<ffi::String>().value_or("") == match) return true;
  }
  return false;
}

// The client's handshake: [RPC magic, key "client:<match> [-timeout=S]"]. Returns the session
// timeout in seconds (0: none), or -1 when the connection is not for this key.
double Handshake(int conn, const Options& opt, const std::string& match) {
  int32_t magic = 0, size = 0;
  if (!RecvInt(conn, &magic) || magic != kRpcMagic || !RecvInt(conn, &size) || size < 0 ||
      size > 4096) {
    return -1;
  }
  std::string key(static_cast<size_t>(size), '\0');
  if (!RecvAll(conn, key.data(), key.size())) return -1;
  std::string head = key.substr(0, key.find(' '));
  if (head != "client:" + match) {
    SendInt(conn, kCodeMismatch);
    return -1;
  }
  std::string server_key = "server:" + opt.key;
  SendInt(conn, kCodeSuccess);
  SendInt(conn, static_cast<int32_t>(server_key.size()));
  SendAll(conn, server_key.data(), server_key.size());
  size_t at = key.find("-timeout=");
  return at == std::string::npos ? 0.0 : std::atof(key.c_str() + at + 9);
}

// In the forked child: a fresh work folder, the functions server.py registers in Python,
// then TVM's RPC loop on the connection until the client closes it.
[[noreturn]] void Serve(int conn) {
  char folder[] = "/tmp/aotc-rpc-XXXXXX";
  if (mkdtemp(folder) == nullptr || chdir(folder) != 0) _exit(1);
  std::string root = folder;
  ffi::Function::SetGlobal("tvm.rpc.server.workpath", ffi::Function::FromTyped(
      [root](ffi::String path) { return ffi::String(root + "/" + std::string(path)); }), true);
  ffi::Function::SetGlobal("tvm.rpc.server.load_module", ffi::Function::FromTyped(
      [root](ffi::String name) { return ffi::Module::LoadFromFile(root + "/" + std::string(name)); }),
      true);
  auto loop = ffi::Function::GetGlobal("rpc.ServerLoop");
  if (!loop.has_value()) _exit(2);
  (*loop)(conn);
  std::filesystem::remove_all(root);
  _exit(0);
}

// Serve one session in a child; kill it when the session's timeout passes (a hung kernel).
void RunSession(int conn, double timeout) {
  pid_t child = fork();
  if (child == 0) Serve(conn);
  auto start = std::chrono::steady_clock::now();
  int status = 0;
  while (waitpid(child, &status, WNOHANG) == 0) {
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (timeout > 0 && elapsed > timeout) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  close(conn);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt = Parse(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  // MetaSchedule's RPC runner fills candidate arguments with random data through
  // tvm.contrib.random.random_fill_for_measure, which lives in libtvm_runtime_extra.so.
  if (dlopen("libtvm_runtime_extra.so", RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    std::fprintf(stderr, "aotc-rpc-server: warning: %s (tuning candidates will fail)\n", dlerror());
  }
  int port = 0;
  int listener = Listen(opt, &port);
  std::fprintf(stderr, "aotc-rpc-server: listening on %s:%d, key %s\n", opt.host.c_str(), port,
               opt.key.c_str());
  int tracker = -1;
  while (true) {
    while (tracker < 0) {  // (re)connect, as server.py does after a tracker restart
      tracker = ConnectTracker(opt, port);
      if (tracker < 0) std::this_thread::sleep_for(std::chrono::seconds(kPingSeconds));
    }
    std::string match = NewMatchKey(opt.key);
    if (!Offer(tracker, opt, port, match)) {
      close(tracker);
      tracker = -1;
      continue;
    }
    int unmatched = 0;
    bool ok = true;
    while (ok) {
      fd_set ready;
      FD_ZERO(&ready);
      FD_SET(listener, &ready);
      timeval wait{kPingSeconds, 0};
      if (select(listener + 1, &ready, nullptr, nullptr, &wait) > 0) {
        int conn = accept(listener, nullptr, nullptr);
        double timeout = conn >= 0 ? Handshake(conn, opt, match) : -1;
        if (timeout < 0) {
          if (conn >= 0) close(conn);
          continue;
        }
        RunSession(conn, timeout);
        break;  // the key is used: offer a new one
      }
      unmatched = Pending(tracker, match, &ok) ? 0 : unmatched + kPingSeconds;
      if (ok && unmatched > kUnmatchedSeconds + kPingSeconds) break;  // re-offer a new key
    }
    if (!ok) {
      close(tracker);
      tracker = -1;
    }
  }
}
