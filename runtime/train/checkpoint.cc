// Sharded checkpoint files and directories (checkpoint.h).
#include "runtime/train/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include "shared/base/files.h"
#include "shared/base/json_io.h"
#include "shared/base/text.h"

namespace hzp::runtime {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::uint64_t kFnvOffset = 14695981039346656037ull;  // 0xcbf29ce484222325
constexpr std::uint64_t kFnvPrime = 1099511628211ull;

std::uint64_t fnv1a(std::uint64_t h, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
  return h;
}

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

Status bad(const std::string& where, const std::string& what) {
  return Status::InvalidInput(where + ": " + what);
}

// The first non-finite value of the spans, as "segment value k", or "".
std::string first_non_finite(const std::vector<FloatSpan>& spans) {
  for (std::size_t s = 0; s < spans.size(); ++s)
    for (std::int64_t i = 0; i < spans[s].count; ++i)
      if (!std::isfinite(spans[s].data[i])) return "span " + std::to_string(s) + " value " + std::to_string(i);
  return "";
}

Status write_all(int fd, const void* data, std::size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      return Status::Internal("checkpoint: writing " + printable(path, 200) + " failed: " + std::strerror(errno));
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return Status::Ok();
}

Status read_all(int fd, void* data, std::size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return Status::InvalidInput("short read");
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return Status::Ok();
}

}  // namespace

json CheckpointHeader::to_json() const {
  json segs = json::array();
  for (const auto& [p, o] : segments) segs.push_back({p, o});
  json out = {{"format", kCheckpointFormat},
              {"rank", rank},
              {"world_size", world_size},
              {"policy", policy},
              {"precision", precision},
              {"next_step", next_step},
              {"adam_steps", adam_steps},
              {"loss_scale", loss_scale},
              {"loss_scale_good_steps", loss_scale_good_steps},
              {"segments", segs},
              {"payload_bytes", payload_bytes},
              {"payload_fnv1a64", hex64(checksum)}};
  if (!layout.is_null()) out["layout"] = layout;
  return out;
}

Result<CheckpointHeader> parse_checkpoint_header(const std::string& line) {
  HZP_ASSIGN_OR_RETURN(json h, parse_json_strict(line, kMaxCheckpointHeaderBytes, 8));
  if (!h.is_object()) return bad("header", "not a JSON object");
  auto field = [&](const char* key) -> Result<const json*> {
    if (!h.contains(key)) return bad(key, "missing");
    return &h.at(key);
  };
  auto integer = [&](const char* key, std::int64_t min, std::int64_t max) -> Result<std::int64_t> {
    HZP_ASSIGN_OR_RETURN(const json* v, field(key));
    if (!v->is_number_integer()) return bad(key, "must be an integer, got " + printable(v->dump(), 60));
    const std::string range = "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "], got ";
    if (v->is_number_unsigned() && v->get<std::uint64_t>() > static_cast<std::uint64_t>(max))
      return bad(key, range + printable(v->dump(), 60));
    const std::int64_t x = v->get<std::int64_t>();
    if (x < min || x > max) return bad(key, range + std::to_string(x));
    return x;
  };
  auto string = [&](const char* key) -> Result<std::string> {
    HZP_ASSIGN_OR_RETURN(const json* v, field(key));
    if (!v->is_string()) return bad(key, "must be a string, got " + printable(v->dump(), 60));
    return v->get<std::string>();
  };
  // A key hzp does not write is an edit (or another program's file): refused, not ignored.
  static const char* const kKeys[] = {"format",     "rank",          "world_size",
                                      "policy",     "precision",     "next_step",
                                      "adam_steps", "loss_scale",    "loss_scale_good_steps",
                                      "segments",   "payload_bytes", "payload_fnv1a64",
                                      "layout"};
  for (const auto& [key, value] : h.items())
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys))
      return bad("header", "unknown key " + quoted(key, 40));
  HZP_ASSIGN_OR_RETURN(std::string format, string("format"));
  const bool v1 = format == kCheckpointFormatV1;
  if (format != kCheckpointFormat && !v1) return bad("format", "not an hzp checkpoint (" + quoted(format, 40) + ")");
  CheckpointHeader out;
  HZP_ASSIGN_OR_RETURN(const std::int64_t world, integer("world_size", 1, 1 << 20));
  HZP_ASSIGN_OR_RETURN(const std::int64_t rank, integer("rank", 0, world - 1));
  out.world_size = static_cast<int>(world);
  out.rank = static_cast<int>(rank);
  HZP_ASSIGN_OR_RETURN(out.policy, string("policy"));
  HZP_ASSIGN_OR_RETURN(out.next_step, integer("next_step", 0, 1'000'000'000));
  HZP_ASSIGN_OR_RETURN(out.adam_steps, integer("adam_steps", 0, out.next_step));
  if (!v1) {  // v1 files were always fp32 without a loss scaler: the defaults
    HZP_ASSIGN_OR_RETURN(out.precision, string("precision"));
    if (out.precision != "fp32" && out.precision != "bf16" && out.precision != "fp16")
      return bad("precision", "must be \"fp32\", \"bf16\" or \"fp16\", got " + quoted(out.precision, 40));
    HZP_ASSIGN_OR_RETURN(const json* scale, field("loss_scale"));
    // Halving and doubling from 2^16 stays within [2^-24, 2^64] long before anything else breaks.
    if (!scale->is_number() || !std::isfinite(scale->get<double>()) || scale->get<double>() < 0x1p-24 ||
        scale->get<double>() > 0x1p64)
      return bad("loss_scale", "must be a number in [2^-24, 2^64], got " + printable(scale->dump(), 60));
    out.loss_scale = scale->get<double>();
    HZP_ASSIGN_OR_RETURN(out.loss_scale_good_steps, integer("loss_scale_good_steps", 0, out.next_step));
  }
  // Only fp16's loss scaler skips optimizer steps: elsewhere every step is an Adam step (its bias correction).
  if (out.precision != "fp16" && out.adam_steps != out.next_step)
    return bad("adam_steps", "must equal next_step (" + std::to_string(out.next_step) + ") in " + out.precision +
                                 " training, where no step is skipped; got " + std::to_string(out.adam_steps));
  HZP_ASSIGN_OR_RETURN(out.payload_bytes, integer("payload_bytes", 0, std::int64_t{1} << 50));
  HZP_ASSIGN_OR_RETURN(std::string sum, string("payload_fnv1a64"));
  if (sum.size() != 16 || sum.find_first_not_of("0123456789abcdef") != std::string::npos)
    return bad("payload_fnv1a64", "must be 16 lowercase hex digits, got " + quoted(sum, 40));
  out.checksum = std::stoull(sum, nullptr, 16);
  HZP_ASSIGN_OR_RETURN(const json* segs, field("segments"));
  if (!segs->is_array()) return bad("segments", "must be an array");
  std::int64_t floats = 0;
  for (std::size_t i = 0; i < segs->size(); ++i) {
    const json& s = (*segs)[i];
    const std::string where = "segments[" + std::to_string(i) + "]";
    if (!s.is_array() || s.size() != 2 || !s[0].is_number_unsigned() || !s[1].is_number_unsigned() ||
        s[0].get<std::uint64_t>() > (1ull << 40) || s[1].get<std::uint64_t>() > (1ull << 40))
      return bad(where, "must be [parameter floats, optimizer floats] below 2^40, got " + printable(s.dump(), 60));
    out.segments.emplace_back(s[0].get<std::int64_t>(), s[1].get<std::int64_t>());
    // The optimizer slice holds Adam m and v, plus the fp32 master in 16-bit training.
    floats += out.segments.back().first + (out.precision == "fp32" ? 2 : 3) * out.segments.back().second;
  }
  if (floats * 4 != out.payload_bytes)
    return bad("payload_bytes", std::to_string(out.payload_bytes) + " disagrees with the segments (" +
                                    std::to_string(floats * 4) + " bytes)");
  if (h.contains("layout")) {
    if (!h["layout"].is_object()) return bad("layout", "must be an object");
    out.layout = h["layout"];
  }
  return out;
}

Status write_checkpoint(const std::string& path, CheckpointHeader header, const std::vector<FloatSpan>& spans) {
  if (const std::string where = first_non_finite(spans); !where.empty())
    return Status::Internal("checkpoint: refusing to write a state holding NaN or Inf (" + where +
                            "): training diverged before step " + std::to_string(header.next_step));
  std::uint64_t sum = kFnvOffset;
  std::int64_t bytes = 0;
  for (const FloatSpan& s : spans) {
    sum = fnv1a(sum, s.data, static_cast<std::size_t>(s.count) * 4);
    bytes += s.count * 4;
  }
  header.payload_bytes = bytes;
  header.checksum = sum;
  const std::string line = header.to_json().dump() + "\n";
  const std::string tmp = path + ".tmp";
  Result<int> opened = create_temp_file(tmp);
  if (!opened.ok()) return opened.status().prefixed("checkpoint: ");
  const int fd = *opened;
  Status st = write_all(fd, line.data(), line.size(), tmp);
  for (const FloatSpan& s : spans)
    if (st.ok()) st = write_all(fd, s.data, static_cast<std::size_t>(s.count) * 4, tmp);
  // fsync before the rename: after a power loss the file is either the old one or complete.
  if (st.ok() && ::fsync(fd) != 0) st = Status::Internal("checkpoint: fsync of " + printable(tmp, 200) + " failed");
  ::close(fd);
  // Something in the way of the rank file (a directory at its name) is the directory's problem: bad input.
  if (st.ok() && std::rename(tmp.c_str(), path.c_str()) != 0)
    st = Status::InvalidInput("checkpoint: cannot rename " + printable(tmp, 200) + " to " + printable(path, 200) +
                              ": " + std::strerror(errno));
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  const int dir = ::open(fs::path(path).parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
  return Status::Ok();
}

Result<CheckpointHeader> read_checkpoint(const std::string& path, const CheckpointHeader& expected,
                                         std::int64_t max_step, const std::vector<FloatSpan>& spans) {
  const std::string shown = "checkpoint " + printable(path, 200);
  auto opened = open_regular_file(path, Links::kNoLinks);  // never read through a link out of the folder
  if (!opened.ok()) return Status::InvalidInput("checkpoint " + opened.status().message());
  const int fd = *opened;
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return Status::InvalidInput(shown + ": not a regular file");
  // The header line, read byte by byte up to its newline (bounded).
  std::string line;
  for (char c = 0;;) {
    if (::read(fd, &c, 1) != 1) return Status::InvalidInput(shown + ": truncated header");
    if (c == '\n') break;
    line += c;
    if (line.size() > kMaxCheckpointHeaderBytes) return Status::InvalidInput(shown + ": no header line");
  }
  auto parsed = parse_checkpoint_header(line);
  if (!parsed.ok()) return Status::InvalidInput(shown + ": header " + parsed.status().message());
  const CheckpointHeader& h = *parsed;
  if (h.precision != expected.precision)  // the step's, named by its folder: every rank says the same
    return Status::InvalidInput(printable(std::filesystem::path(path).parent_path().string(), 200) + " holds a " +
                                h.precision + " training state; this run trains in " + expected.precision +
                                " (set training.precision to resume it)");
  if (!h.same_layout(expected))
    return Status::InvalidInput(shown + " was written by another layout (world " + std::to_string(h.world_size) +
                                ", policy " + quoted(h.policy, 40) + ", rank " + std::to_string(h.rank) +
                                "; this run: world " + std::to_string(expected.world_size) + ", policy " +
                                quoted(expected.policy, 40) + ", rank " + std::to_string(expected.rank) + ")");
  if (h.next_step > max_step)
    return Status::InvalidInput(shown + ": next_step " + std::to_string(h.next_step) + " is beyond the run's " +
                                std::to_string(max_step) + " steps");
  const std::int64_t expected_size = static_cast<std::int64_t>(line.size()) + 1 + h.payload_bytes;
  if (st.st_size != expected_size)
    return Status::InvalidInput(shown + ": " + std::to_string(st.st_size) + " bytes where the header promises " +
                                std::to_string(expected_size) + (st.st_size < expected_size ? " (truncated)" : ""));
  std::uint64_t sum = kFnvOffset;
  for (const FloatSpan& s : spans) {
    if (!read_all(fd, s.data, static_cast<std::size_t>(s.count) * 4).ok())
      return Status::InvalidInput(shown + ": truncated payload");
    sum = fnv1a(sum, s.data, static_cast<std::size_t>(s.count) * 4);
  }
  if (sum != h.checksum)
    return Status::InvalidInput(shown + ": payload checksum " + hex64(sum) + " does not match the header's " +
                                hex64(h.checksum) + " (the file is damaged)");
  if (const std::string where = first_non_finite(spans); !where.empty())
    return Status::InvalidInput(shown + ": holds NaN or Inf (" + where + "); refusing to resume a diverged state");
  return parsed;
}

Result<CheckpointHeader> read_checkpoint_header(const std::string& path) {
  const std::string shown = "checkpoint " + printable(path, 200);
  auto opened = open_regular_file(path, Links::kNoLinks);  // never read through a link out of the folder
  if (!opened.ok()) return Status::InvalidInput("checkpoint " + opened.status().message());
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{*opened};
  std::string line;
  for (char c = 0;;) {
    if (::read(closer.fd, &c, 1) != 1) return Status::InvalidInput(shown + ": truncated header");
    if (c == '\n') break;
    line += c;
    if (line.size() > kMaxCheckpointHeaderBytes) return Status::InvalidInput(shown + ": no header line");
  }
  auto parsed = parse_checkpoint_header(line);
  if (!parsed.ok()) return Status::InvalidInput(shown + ": header " + parsed.status().message());
  return parsed;
}

Result<std::vector<std::vector<float>>> read_checkpoint_payload(const std::string& path, const CheckpointHeader& header,
                                                                std::int64_t max_step) {
  std::vector<std::vector<float>> parts;
  for (const auto& [param, optimizer] : header.segments) {
    parts.emplace_back(static_cast<std::size_t>(param));
    for (int k = header.precision == "fp32" ? 2 : 3; k > 0; --k)
      parts.emplace_back(static_cast<std::size_t>(optimizer));
  }
  std::vector<FloatSpan> spans;
  for (auto& p : parts) spans.push_back({p.data(), static_cast<std::int64_t>(p.size())});
  HZP_RETURN_IF_ERROR(read_checkpoint(path, header, max_step, spans).status());
  return parts;
}

std::string checkpoint_file(const std::string& dir, std::int64_t step, int rank) {
  return (fs::path(dir) / ("step_" + std::to_string(step)) / ("rank_" + std::to_string(rank) + ".bin")).string();
}

Result<std::int64_t> read_latest(const std::string& dir) {
  const std::string path = (fs::path(dir) / "latest").string();
  auto text = read_text_file(path, 64, Links::kNoLinks);
  if (!text.ok())
    return Status::InvalidInput("--resume: no checkpoint in " + printable(dir, 200) + " (" + text.status().message() +
                                ")");
  std::string t = *text;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  if (t.empty() || t.size() > 10 || t.find_first_not_of("0123456789") != std::string::npos)
    return Status::InvalidInput("--resume: " + printable(path, 200) + " does not hold a step number (" + quoted(t, 20) +
                                ")");
  return std::stoll(t);
}

Status write_latest(const std::string& dir, std::int64_t step) {
  return write_file_atomic((fs::path(dir) / "latest").string(), std::to_string(step) + "\n");
}

Result<std::unique_ptr<CheckpointDirLock>> CheckpointDirLock::acquire(const std::string& dir) {
  HZP_RETURN_IF_ERROR(ensure_writable_dir(dir, "--checkpoint-dir"));
  const std::string path = (fs::path(dir) / ".lock").string();
  // O_NOFOLLOW: a .lock that is a symlink must not lead hzp to truncate the file it points at.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0)
    return Status::InvalidInput("--checkpoint-dir: cannot open " + printable(path, 200) + ": " + std::strerror(errno) +
                                (errno == ELOOP ? " (it is a symbolic link; remove it)" : ""));
  // A .lock hard-linked to another file (or not a file) would be truncated and written below: refused.
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
    ::close(fd);
    return Status::InvalidInput("--checkpoint-dir: " + printable(path, 200) +
                                " is not a lock file of its own (a hard link to another file, or not a regular "
                                "file); remove it");
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char holder[256] = {};
    const ssize_t n = ::pread(fd, holder, sizeof holder - 1, 0);
    ::close(fd);
    return Status::InvalidInput("--checkpoint-dir " + printable(dir, 200) + " is in use by another hzp train job (" +
                                printable(std::string(holder, n > 0 ? static_cast<std::size_t>(n) : 0), 120) +
                                "); give each job its own directory");
  }
  char host[128] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string who = "pid " + std::to_string(::getpid()) + " on " + host;
  if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, who.data(), who.size(), 0);
  // Holding the lock, nobody else writes here: hzp's own temporary files (latest.tmp, step_N/rank_R.bin.tmp)
  // are leftovers of a crashed writer. Only those: a user's notes.tmp beside them is not hzp's to remove.
  static const std::regex ours(R"(latest\.tmp|step_[0-9]+/rank_[0-9]+\.bin\.tmp)");
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it.depth() > 1) it.disable_recursion_pending();
    const std::string relative = it->path().lexically_relative(dir).generic_string();
    if (std::regex_match(relative, ours) && it->is_regular_file(ec) && !it->is_symlink(ec)) fs::remove(it->path(), ec);
  }
  return std::unique_ptr<CheckpointDirLock>(new CheckpointDirLock(fd));
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

}  // namespace hzp::runtime
