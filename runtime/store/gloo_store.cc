// GlooStore: Gloo's rendezvous::Store calls mapped onto StoreClient (gloo_store.h).
#include "runtime/store/gloo_store.h"

#include <gloo/common/error.h>

namespace hzp::runtime {

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  const Status s = client_->set(key, std::string(data.begin(), data.end()));
  if (!s.ok())
    throw gloo::IoException(__FILE__ ":" + std::to_string(__LINE__) + " store set '" + key + "': " + s.message());
}

std::vector<char> GlooStore::get(const std::string& key) {
  Result<std::string> v = client_->get(key, timeout_);
  if (!v.ok())
    throw gloo::IoException(__FILE__ ":" + std::to_string(__LINE__) + " store get '" + key +
                            "': " + v.status().message());
  return std::vector<char>(v->begin(), v->end());
}

void GlooStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  // A GET that finds the key returns at once; one that does not waits at most `timeout` in all.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const std::string& key : keys) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    Result<std::string> v = client_->get(key, std::max(left, std::chrono::milliseconds(1)));
    if (!v.ok())
      throw gloo::IoException(__FILE__ ":" + std::to_string(__LINE__) + " store wait for '" + key +
                              "': " + v.status().message());
  }
}

}  // namespace hzp::runtime
