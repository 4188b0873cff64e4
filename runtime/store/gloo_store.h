// Gloo's rendezvous::Store over the hzp store (store.h): how Gloo contexts of the CPU backend exchange
// their TCP addresses. Gloo's interface reports failure by exception, so this adapter throws
// gloo::IoException naming the key; the communicator that owns the context turns it into a Status.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "runtime/store/store.h"

namespace hzp::runtime {

class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(std::unique_ptr<StoreClient> client, std::chrono::milliseconds timeout)
      : client_(std::move(client)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  std::unique_ptr<StoreClient> client_;
  std::chrono::milliseconds timeout_;
};

}  // namespace hzp::runtime
