// Reading and writing files for every part of hzp: bounded reads that refuse what is not a regular file,
// atomic durable writes (temporary file, fsync, rename, fsync of the directory), and an up-front check that
// an output directory can be written — so that a run fails before its work, not after it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shared/base/status.h"

namespace hzp {

// A descriptor of `path` opened for reading if it is a regular file (the caller closes it); a FIFO, a device
// or a directory is kInvalidInput naming it, at once (opening never waits for a FIFO's writer). The
// descriptor is non-blocking: a read that would wait (/proc/kmsg) fails with EAGAIN instead. With
// kNoLinks, a `path` that is itself a symlink is refused too (a checkpoint's files are read only from inside
// its directory, never through a link out of it).
enum class Links { kFollow, kNoLinks };
Result<int> open_regular_file(const std::string& path, Links links = Links::kFollow);

// The whole file, if it is a regular file of at most `max_bytes`. Errors (kInvalidInput) name the path
// and say what is wrong: missing, a directory, unreadable, too large.
Result<std::string> read_text_file(const std::string& path, std::int64_t max_bytes = 64ll << 20,
                                   Links links = Links::kFollow);

// The file's text, gunzipped when it starts with the gzip magic (1f 8b): a compressed file of at most
// `max_bytes` that inflates to at most `max_bytes` (a larger result is refused as it grows, so a gzip bomb
// costs no more memory than the limit). A corrupt or truncated stream is an error naming the path.
Result<std::string> read_maybe_gzip_file(const std::string& path, std::int64_t max_bytes);

// A new, empty regular file at `tmp` opened for writing (the caller closes it): whatever was there — a
// leftover, a symbolic link, a FIFO that would block the open forever — is unlinked first, and the file is
// created exclusively and never through a link. A directory there is kInvalidInput naming it.
Result<int> create_temp_file(const std::string& tmp);

// Writes `text` to `path` so that a reader sees the old file or the complete new one, and a power loss
// after the call returns loses neither: write PATH.tmp (create_temp_file), fsync it, rename over PATH,
// fsync the directory. The rename replaces a link at PATH rather than writing through it: nothing is
// written outside PATH's directory. A directory, FIFO, device or socket at PATH (or a link's target) is
// kInvalidInput and stays as it is.
Status write_file_atomic(const std::string& path, const std::string& text);

// `text` as a gzip stream (RFC 1952, zlib's fastest level), which read_maybe_gzip_file, gzip and Perfetto read.
Result<std::string> gzip_text(const std::string& text);

// Creates `dir` (and parents) if needed and proves it writable by creating and removing a probe file.
// `what` names the option or field in the error, e.g. "--out".
Status ensure_writable_dir(const std::string& dir, const std::string& what);

// A path a command reads or writes, named by its option or field: {"--out", "plan.json"}.
struct NamedPath {
  std::string what;
  std::string path;
};

// Checks a command's output files before its work, so that it fails at once rather than after it (or
// half-way through its outputs). Each output is a non-empty path that names a regular file or nothing —
// not a directory, FIFO, device or socket, nor a link to one (write_file_atomic would replace it) — in a
// directory that exists or can be created, and is writable. No two outputs are the same file, and no output
// is one of `inputs` (a file that exists; "-", stdin, and preset names are skipped), nor would its
// temporary PATH.tmp replace one. Two paths are the same file when they name one inode (a link or another
// spelling counts) or, before either exists, the same absolute path. Errors name both options.
Status check_output_files(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs = {});

// Whether `path` lies inside directory `dir` (or is it), both made absolute with `.`, `..` and the links of
// their existing part resolved: an input a command is about to write over or remove.
bool is_inside(const std::string& path, const std::string& dir);

// The outputs DIR/name for each of `names`, named "WHAT DIR/name" in errors (--out out/x/summary.json).
std::vector<NamedPath> files_in_dir(const std::string& what, const std::string& dir,
                                    const std::vector<std::string>& names);

// A name made safe as one path component: letters, digits, '-', '_', '.' kept; everything else becomes
// '_'; never empty, never "." or "..", at most 100 bytes.
std::string safe_file_name(const std::string& name);

}  // namespace hzp
