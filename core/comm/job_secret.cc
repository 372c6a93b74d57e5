#include "core/comm/job_secret.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/comm/store_protocol.h"
#include "core/error.h"

namespace tessel::comm {

namespace {
std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t'))
    s.pop_back();
  size_t start = s.find_first_not_of(" \t");
  return start == std::string::npos ? std::string() : s.substr(start);
}

void CheckLength(const std::string& secret, const std::string& source) {
  TESSEL_CHECK(secret.size() >= kMinSecretChars && secret.size() <= kMaxSecretChars)
      << "the job secret from " << source << " has " << secret.size() << " characters; expected "
      << kMinSecretChars << ".." << kMaxSecretChars << " (e.g. `openssl rand -hex 32`)";
}
}  // namespace

std::string NewJobSecret() {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (uint8_t b : store::RandomNonce()) {  // 32 bytes from the kernel's random source
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

std::string ReadSecretFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TESSEL_CHECK(fd >= 0) << "cannot open the job secret file '" << path << "': " << std::strerror(errno);
  struct stat st {};
  ::fstat(fd, &st);
  if (!S_ISREG(st.st_mode) || (st.st_mode & 077) != 0 ||
      st.st_size > static_cast<off_t>(kMaxSecretChars + 2)) {
    ::close(fd);
    TESSEL_CHECK(S_ISREG(st.st_mode)) << "the job secret file '" << path << "' is not a regular file";
    TESSEL_CHECK((st.st_mode & 077) == 0)
        << "the job secret file '" << path << "' is readable by other users (mode 0" << std::oct
        << (st.st_mode & 0777) << std::dec << "); `chmod 600 " << path << "`";
    TESSEL_THROW(StatusCode::kInvalidArgument) << "the job secret file '" << path << "' has " << st.st_size
                                               << " bytes; expected at most " << kMaxSecretChars;
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  ssize_t n = ::read(fd, text.data(), text.size());
  ::close(fd);
  TESSEL_CHECK(n == st.st_size) << "cannot read the job secret file '" << path << "'";
  std::string secret = Trim(text);
  CheckLength(secret, "file '" + path + "'");
  return secret;
}

std::string JobSecretFrom(const std::map<std::string, std::string>& vars) {
  auto it = vars.find("TESSEL_JOB_SECRET");
  if (it != vars.end() && !it->second.empty()) {
    CheckLength(it->second, "TESSEL_JOB_SECRET");
    return it->second;
  }
  auto file = vars.find("TESSEL_JOB_SECRET_FILE");
  if (file != vars.end() && !file->second.empty()) return ReadSecretFile(file->second);
  return "";
}

std::string ReadJobSecret() {
  std::map<std::string, std::string> vars;
  for (const char* name : {"TESSEL_JOB_SECRET", "TESSEL_JOB_SECRET_FILE"}) {
    if (const char* v = std::getenv(name)) vars[name] = v;
  }
  return JobSecretFrom(vars);
}

std::array<uint8_t, 32> SecretMac(const std::string& secret, std::string_view message) {
  std::array<uint8_t, 32> mac{};
  unsigned int len = static_cast<unsigned int>(mac.size());
  const unsigned char* ok =
      ::HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
             reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac.data(), &len);
  TESSEL_CHECK_CODE(ok != nullptr && len == mac.size(), StatusCode::kInternal) << "HMAC-SHA256 failed";
  return mac;
}

}  // namespace tessel::comm
