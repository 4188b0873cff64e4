// Pooled daemon actors that run short jobs inside a simulation, and a countdown to wait for a batch of them.
//
// Creating a SimGrid actor allocates and zeroes its stack (256 KiB, configure_engine): a fifth of a large
// recipe's simulation went there when every job had an actor of its own. A pool's actor that finishes a job
// waits on its own condition variable for the next one. Its actors are daemons: the simulation ends when the
// ranks' actors do, whatever the pool's are doing.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <simgrid/s4u/ConditionVariable.hpp>
#include <simgrid/s4u/Host.hpp>
#include <simgrid/s4u/Mutex.hpp>

namespace hzp::sim {

class ActorPool {
 public:
  explicit ActorPool(std::string name) : name_(std::move(name)) {}
  ActorPool(const ActorPool&) = delete;
  ActorPool& operator=(const ActorPool&) = delete;

  // Runs `job` on an idle actor of the pool, or on a new one created on `host` (where an actor sits does
  // not matter to the flows it starts: each names its own hosts). The job starts at the current simulated
  // time, once the calling actor yields.
  void run(simgrid::s4u::Host* host, std::function<void()> job);

 private:
  struct Worker {
    std::function<void()> job;  // empty: idle
    simgrid::s4u::MutexPtr mutex = simgrid::s4u::Mutex::create();
    simgrid::s4u::ConditionVariablePtr cv = simgrid::s4u::ConditionVariable::create();
  };
  void loop(Worker* worker);

  std::string name_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<Worker*> idle_;
};

// Counts jobs down to zero; wait() returns once every one has called done().
class Countdown {
 public:
  explicit Countdown(int pending) : pending_(pending) {}
  void done();
  void wait();

 private:
  int pending_;
  simgrid::s4u::MutexPtr mutex_ = simgrid::s4u::Mutex::create();
  simgrid::s4u::ConditionVariablePtr cv_ = simgrid::s4u::ConditionVariable::create();
};

}  // namespace hzp::sim
