// Runs a fuzz target over files (or every file in directories) without
// libFuzzer: the corpus replay that the regular build's tests run.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  size_t runs = 0;
  auto replay = [&](const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ++runs;
  };
  for (int i = 1; i < argc; ++i) {
    if (fs::is_directory(argv[i])) {
      for (const auto& entry : fs::recursive_directory_iterator(argv[i])) {
        if (entry.is_regular_file()) replay(entry.path());
      }
    } else {
      replay(argv[i]);
    }
  }
  LLVMFuzzerTestOneInput(nullptr, 0);  // the empty input too
  std::printf("replayed %zu inputs: %zu passed, 0 failed\n", runs + 1, runs + 1);
  return 0;
}
