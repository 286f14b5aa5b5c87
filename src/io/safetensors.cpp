// safetensors reader / writer. Validation mirrors the Python/Rust library
// (safetensors 0.4+): the header is a JSON object, every tensor's byte span
// matches numel x dtype size, spans are disjoint and cover the data region
// exactly (no holes), and names are unique.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/fs_util.h"
#include "numerics/fp8.h"

namespace fp8kv {

namespace {

constexpr uint64_t kMaxHeaderLen = 100ull << 20;  // 100 MiB, as the Python library

struct DtypeEntry {
  DType d;
  std::string_view name;
  size_t size;
};
constexpr DtypeEntry kDtypes[] = {
    {DType::BOOL, "BOOL", 1}, {DType::U8, "U8", 1},     {DType::I8, "I8", 1},
    {DType::I16, "I16", 2},   {DType::U16, "U16", 2},   {DType::I32, "I32", 4},
    {DType::U32, "U32", 4},   {DType::I64, "I64", 8},   {DType::U64, "U64", 8},
    {DType::F16, "F16", 2},   {DType::BF16, "BF16", 2}, {DType::F32, "F32", 4},
    {DType::F64, "F64", 8},   {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
};

// Names and JSON fragments from a malformed file may hold arbitrary bytes:
// keep error messages printable ASCII (they end up in logs and JSON).
std::string printable(std::string_view s, size_t max_len = 200) {
  std::string out;
  for (char c : s.substr(0, max_len)) {
    const auto u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7f) ? c : '?';
  }
  if (s.size() > max_len) out += "...";
  return out;
}

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw InputError(fmt::format("{}: {}", source, what));
}

[[noreturn]] void fail_tensor(const std::string& source, const std::string& name, const std::string& what) {
  throw InputError(fmt::format("{}: tensor '{}': {}", source, printable(name), what));
}

uint64_t read_le_u64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// A JSON number that is a non-negative integer representable in uint64.
std::optional<uint64_t> as_u64(const nlohmann::json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i >= 0) return static_cast<uint64_t>(i);
  }
  return std::nullopt;
}

float half_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
  return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace

std::string_view dtype_name(DType d) {
  for (const auto& e : kDtypes)
    if (e.d == d) return e.name;
  return "?";
}

std::optional<DType> parse_dtype(std::string_view s) {
  for (const auto& e : kDtypes)
    if (e.name == s) return e.d;
  return std::nullopt;
}

size_t dtype_size(DType d) {
  for (const auto& e : kDtypes)
    if (e.d == d) return e.size;
  return 0;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

ParsedHeader parse_safetensors_header(std::span<const std::byte> file_prefix, uint64_t file_size,
                                      const std::string& source) {
  if (file_size == 0) fail(source, "empty file (expected a safetensors file)");
  if (file_size < 8 || file_prefix.size() < 8)
    fail(source, fmt::format("file is {} bytes, shorter than the 8-byte header length", file_size));
  ParsedHeader h;
  h.header_len = read_le_u64(file_prefix.data());
  if (h.header_len > kMaxHeaderLen)
    fail(source, fmt::format("header length {} exceeds the 100 MiB limit", h.header_len));
  if (h.header_len > file_size - 8)
    fail(source, fmt::format("header length {} extends beyond the end of the file ({} bytes)", h.header_len,
                             file_size));
  if (h.header_len < 2) fail(source, fmt::format("header length {} is too small for a JSON object", h.header_len));
  if (file_prefix.size() < 8 + h.header_len)
    fail(source, fmt::format("only {} bytes available, header needs {}", file_prefix.size(), 8 + h.header_len));
  h.data_start = 8 + h.header_len;
  const uint64_t data_size = file_size - h.data_start;

  const char* text = reinterpret_cast<const char*>(file_prefix.data() + 8);
  const std::string_view header_text(text, h.header_len);
  if (header_text.front() != '{') fail(source, "header does not start with '{' (expected a JSON object)");

  // nlohmann keeps the last of duplicate keys silently: catch duplicates of
  // top-level names while parsing.
  std::set<std::string> seen;
  std::string duplicate;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(
        header_text.begin(), header_text.end(),
        [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
          if (depth == 1 && ev == nlohmann::json::parse_event_t::key && duplicate.empty()) {
            const auto& k = parsed.get_ref<const std::string&>();
            if (!seen.insert(k).second) duplicate = k;
          }
          return true;
        });
  } catch (const nlohmann::json::exception& e) {
    fail(source, "header is not valid JSON: " + printable(e.what()));
  }
  if (!duplicate.empty()) fail_tensor(source, duplicate, "duplicate name in header");
  if (!j.is_object()) fail(source, "header is not a JSON object");

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail(source, "__metadata__ must be an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          fail(source, fmt::format("__metadata__ entry '{}' must be a string", printable(m.key())));
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (name.empty()) fail(source, "tensor with an empty name");
    if (!v.is_object()) fail_tensor(source, name, "entry is not an object");
    const auto dt = v.find("dtype");
    const auto sh = v.find("shape");
    const auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) fail_tensor(source, name, "missing or non-string 'dtype'");
    if (sh == v.end() || !sh->is_array()) fail_tensor(source, name, "missing or non-array 'shape'");
    if (off == v.end() || !off->is_array() || off->size() != 2)
      fail_tensor(source, name, "'data_offsets' must be an array [begin, end]");

    TensorInfo t;
    t.name = name;
    const auto dtype = parse_dtype(dt->get_ref<const std::string&>());
    if (!dtype)
      fail_tensor(source, name,
                  fmt::format("unknown dtype '{}' (expected one of BOOL, U8, I8, I16, U16, I32, U32, I64, U64, "
                              "F16, BF16, F32, F64, F8_E4M3, F8_E5M2)",
                              printable(dt->get_ref<const std::string&>())));
    t.dtype = *dtype;

    // numel x size in bytes, with overflow checks (unsigned 128-bit would be
    // simpler; stay portable by checking each multiplication).
    uint64_t nbytes = dtype_size(t.dtype);
    bool overflow = false;
    for (const auto& d : *sh) {
      const auto dim = as_u64(d);
      if (!dim || *dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail_tensor(source, name, fmt::format("shape entry {} is not a non-negative integer", printable(d.dump())));
      t.shape.push_back(static_cast<int64_t>(*dim));
      if (*dim != 0 && nbytes > std::numeric_limits<uint64_t>::max() / *dim) overflow = true;
      else nbytes *= *dim;
    }
    // A zero dimension makes the product 0 whatever overflowed before it.
    if (std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end()) { overflow = false; nbytes = 0; }
    const auto b = as_u64((*off)[0]), e = as_u64((*off)[1]);
    if (!b || !e) fail_tensor(source, name, "data_offsets must be non-negative integers");
    if (*b > *e) fail_tensor(source, name, fmt::format("data_offsets [{}, {}]: begin > end", *b, *e));
    if (*e > data_size)
      fail_tensor(source, name,
                  fmt::format("data_offsets [{}, {}] out of range: the data region has {} bytes", *b, *e, data_size));
    t.begin = *b;
    t.end = *e;
    if (overflow || nbytes != t.end - t.begin)
      fail_tensor(source, name,
                  fmt::format("shape x dtype size = {} bytes but data_offsets span {} bytes",
                              overflow ? std::string("overflow") : std::to_string(nbytes), t.end - t.begin));
    h.tensors.push_back(std::move(t));
  }

  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : (a.end != b.end ? a.end < b.end : a.name < b.name);
  });
  uint64_t pos = 0;
  for (const auto& t : h.tensors) {
    if (t.begin < pos)
      fail_tensor(source, t.name, fmt::format("data_offsets [{}, {}] overlap the previous tensor (ending at {})",
                                              t.begin, t.end, pos));
    if (t.begin > pos)
      fail_tensor(source, t.name,
                  fmt::format("hole in the data region: bytes [{}, {}) belong to no tensor", pos, t.begin));
    pos = t.end;
  }
  if (pos != data_size)
    fail(source, fmt::format("data region has {} bytes but tensors cover only {} (trailing bytes)", data_size, pos));
  return h;
}

// ---------------------------------------------------------------- reader

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  const std::string src = path.string();
  // O_NONBLOCK: a FIFO named model.safetensors would block open() until a
  // writer came; non-blocking, it opens at once and fstat refuses it.
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (f->fd_ < 0) fail(src, fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat st {};
  if (::fstat(f->fd_, &st) != 0) fail(src, fmt::format("cannot stat: {}", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) fail(src, "not a regular file");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size == 0) fail(src, "empty file (expected a safetensors file)");
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, f->fd_, 0);
  if (m == MAP_FAILED) fail(src, fmt::format("cannot mmap {} bytes: {}", size, std::strerror(errno)));
  f->map_ = static_cast<const std::byte*>(m);
  f->map_size_ = size;
  f->header_ = parse_safetensors_header(std::span<const std::byte>(f->map_, f->map_size_), size, src);
  for (size_t i = 0; i < f->header_.tensors.size(); ++i) f->index_[f->header_.tensors[i].name] = i;
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<std::byte*>(map_), map_size_);
  if (fd_ >= 0) ::close(fd_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

TensorView SafetensorsFile::view(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) throw InputError(fmt::format("{}: tensor {} not found", path_.string(), printable(name)));
  TensorView v;
  v.info = t;
  const std::byte* p = map_ + header_.data_start + t->begin;
  const size_t align = dtype_size(t->dtype);
  if (reinterpret_cast<uintptr_t>(p) % align == 0 || t->nbytes() == 0) {
    v.data = p;
    return v;
  }
  std::lock_guard<std::mutex> lock(copies_mutex_);
  auto& slot = copies_[name];
  if (!slot) {
    // operator new[] returns memory aligned for any fundamental type.
    slot.reset(new std::byte[t->nbytes()]);
    std::memcpy(slot.get(), p, t->nbytes());
  }
  v.data = slot.get();
  return v;
}

std::vector<float> SafetensorsFile::to_f32(const std::string& name) const {
  const TensorView v = view(name);
  std::vector<float> out(static_cast<size_t>(v.numel()));
  tensor_to_f32(v, out);
  return out;
}

bool is_float_dtype(DType d) {
  switch (d) {
    case DType::F16: case DType::BF16: case DType::F32: case DType::F64: case DType::F8_E4M3: case DType::F8_E5M2:
      return true;
    default:
      return false;
  }
}

void tensor_to_f32(const TensorView& v, std::span<float> out) {
  const size_t n = static_cast<size_t>(v.numel());
  if (out.size() != n)
    throw InputError(fmt::format("tensor '{}': output has {} elements, tensor has {}", printable(v.info->name),
                                 out.size(), n));
  if (n == 0) return;  // empty tensors: out.data() may be null
  const std::byte* p = v.data;
  switch (v.dtype()) {
    case DType::F32:
      std::memcpy(out.data(), p, n * 4);
      return;
    case DType::F64:
      for (size_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, p + 8 * i, 8);
        out[i] = static_cast<float>(d);
      }
      return;
    case DType::F16:
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = v.dtype() == DType::F16 ? half_to_f32(h) : bf16_to_f32(h);
      }
      return;
    case DType::F8_E4M3:
      for (size_t i = 0; i < n; ++i) out[i] = e4m3_to_f32(static_cast<uint8_t>(p[i]));
      return;
    case DType::F8_E5M2:
      for (size_t i = 0; i < n; ++i) out[i] = e5m2_to_f32(static_cast<uint8_t>(p[i]));
      return;
    default:
      throw InputError(fmt::format("tensor '{}': dtype {} is not a floating-point type (expected F32, F16, BF16, "
                                   "F64, F8_E4M3 or F8_E5M2)",
                                   printable(v.info->name), dtype_name(v.dtype())));
  }
}

// ---------------------------------------------------------------- writer

TensorToWrite make_f32_tensor(std::string name, std::vector<int64_t> shape, std::span<const float> values) {
  TensorToWrite t;
  t.name = std::move(name);
  t.dtype = DType::F32;
  t.shape = std::move(shape);
  int64_t n = 1;
  for (int64_t s : t.shape) n *= s;
  if (n < 0 || static_cast<size_t>(n) != values.size())
    throw InputError(fmt::format("tensor '{}': shape has {} elements but {} values given", t.name, n, values.size()));
  t.data.resize(values.size() * 4);
  if (!values.empty()) std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

std::vector<std::byte> serialize_safetensors(const std::vector<TensorToWrite>& tensors,
                                             const std::map<std::string, std::string>& metadata) {
  // Order as the Python library: larger dtypes first, then by name. Every
  // tensor then starts at a multiple of its dtype size (no padding, no holes).
  std::vector<const TensorToWrite*> order;
  std::set<std::string> names;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      throw InputError(fmt::format("cannot write a tensor named '{}'", printable(t.name)));
    if (!names.insert(t.name).second) throw InputError(fmt::format("duplicate tensor name '{}'", printable(t.name)));
    uint64_t n = dtype_size(t.dtype);
    for (int64_t s : t.shape) {
      if (s < 0) throw InputError(fmt::format("tensor '{}': negative dimension {}", printable(t.name), s));
      n *= static_cast<uint64_t>(s);
    }
    if (n != t.data.size())
      throw InputError(fmt::format("tensor '{}': {} {} x shape needs {} bytes, got {}", printable(t.name),
                                   dtype_name(t.dtype), dtype_size(t.dtype), n, t.data.size()));
    order.push_back(&t);
  }
  std::stable_sort(order.begin(), order.end(), [](const TensorToWrite* a, const TensorToWrite* b) {
    const size_t sa = dtype_size(a->dtype), sb = dtype_size(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  uint64_t pos = 0;
  for (const TensorToWrite* t : order) {
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = std::string(dtype_name(t->dtype));
    e["shape"] = t->shape;
    e["data_offsets"] = {pos, pos + t->data.size()};
    header[t->name] = e;
    pos += t->data.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw InputError(std::string("safetensors header: tensor names and metadata must be valid UTF-8 (") + e.what() +
                     ")");
  }
  while ((8 + text.size()) % 8 != 0) text += ' ';  // data region starts 8-aligned

  std::vector<std::byte> out(8 + text.size() + pos);
  uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((len >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, text.data(), text.size());
  std::byte* d = out.data() + 8 + text.size();
  for (const TensorToWrite* t : order) {
    if (!t->data.empty()) std::memcpy(d, t->data.data(), t->data.size());
    d += t->data.size();
  }
  return out;
}

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const auto bytes = serialize_safetensors(tensors, metadata);
  atomic_write_file(path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

}  // namespace fp8kv
