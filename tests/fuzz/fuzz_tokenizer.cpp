// libFuzzer target: tokenizer.json loading (the streamed BPE model, added
// tokens, normalizers, pre-tokenizers with their Split/regex patterns,
// post-processors, decoders). Any input must either load, and then encode
// and decode a fixed text with every id < vocab_size(), or be refused with
// InputError. Any other exception (a JSON type error, std::regex_error,
// out_of_range, bad_alloc), a crash, a hang or a sanitizer report is a bug:
// the CLI would print "internal error". Build and run: docs/fuzzing.md.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "io/errors.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The loader reads a path (it streams model.vocab / model.merges): the
  // input goes to a per-process file in /dev/shm (or /tmp).
  static const std::string path = [] {
    const char* dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    return std::string(dir) + "/fp8kv_fuzz_tokenizer_" + std::to_string(getpid()) + ".json";
  }();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    const auto tok = fp8kv::Tokenizer::from_file(path);
    // Text that reaches every pre-tokenizer branch: letters, digits,
    // contractions, punctuation, newlines, runs of spaces, non-ASCII.
    static const char* texts[] = {"Hello world! It's 2026, isn't it?\n\n  x  ",
                                  "\xC3\xA9t\xC3\xA9 \xE2\x96\x81 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80 123456",
                                  ""};
    for (const char* t : texts) {
      for (bool special : {false, true}) {
        const std::vector<int> ids = tok->encode(t, special);
        for (int id : ids)
          if (id < 0 || id >= tok->vocab_size()) __builtin_trap();
        (void)tok->decode(ids, false);
        (void)tok->decode(ids, true);
      }
    }
  } catch (const fp8kv::InputError&) {
  }
  return 0;
}
