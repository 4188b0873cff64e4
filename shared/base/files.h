// Reading and writing files for every part of hzp: bounded reads that refuse what is not a regular file,
// atomic durable writes (temporary file, fsync, rename, fsync of the directory), and an up-front check that
// an output directory can be written — so that a run fails before its work, not after it.
#pragma once

#include <cstdint>
#include <string>

#include "shared/base/status.h"

namespace hzp {

// A descriptor of `path` opened for reading if it is a regular file (the caller closes it); a FIFO, a device
// or a directory is kInvalidInput naming it, at once (opening never waits for a FIFO's writer).
Result<int> open_regular_file(const std::string& path);

// The whole file, if it is a regular file of at most `max_bytes`. Errors (kInvalidInput) name the path
// and say what is wrong: missing, a directory, unreadable, too large.
Result<std::string> read_text_file(const std::string& path, std::int64_t max_bytes = 64ll << 20);

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
// written outside PATH's directory.
Status write_file_atomic(const std::string& path, const std::string& text);

// `text` as a gzip stream (RFC 1952, zlib's default level), which read_maybe_gzip_file, gzip and Perfetto read.
Result<std::string> gzip_text(const std::string& text);

// Creates `dir` (and parents) if needed and proves it writable by creating and removing a probe file.
// `what` names the option or field in the error, e.g. "--out".
Status ensure_writable_dir(const std::string& dir, const std::string& what);

// A name made safe as one path component: letters, digits, '-', '_', '.' kept; everything else becomes
// '_'; never empty, never "." or "..", at most 100 bytes.
std::string safe_file_name(const std::string& name);

}  // namespace hzp
