// Pooled daemon actors and a countdown (actor_pool.h).
#include "sim/collectives/actor_pool.h"

#include <mutex>

#include <simgrid/s4u/Actor.hpp>

namespace hzp::sim {
namespace sg4 = simgrid::s4u;

void ActorPool::run(sg4::Host* host, std::function<void()> job) {
  if (idle_.empty()) {
    workers_.push_back(std::make_unique<Worker>());
    Worker* worker = workers_.back().get();
    worker->job = std::move(job);
    sg4::Actor::create(name_, host, [this, worker] { loop(worker); })->daemonize();
    return;
  }
  Worker* worker = idle_.back();
  idle_.pop_back();
  worker->job = std::move(job);
  worker->cv->notify_one();
}

void ActorPool::loop(Worker* worker) {
  for (;;) {
    {
      std::unique_lock<sg4::Mutex> lock(*worker->mutex);
      while (!worker->job) worker->cv->wait(lock);  // a job handed over while locking is seen here
    }
    const std::function<void()> job = std::move(worker->job);
    worker->job = nullptr;
    job();
    idle_.push_back(worker);
  }
}

void Countdown::done() {
  if (--pending_ == 0) cv_->notify_all();
}

void Countdown::wait() {
  std::unique_lock<sg4::Mutex> lock(*mutex_);
  while (pending_ > 0) cv_->wait(lock);
}

}  // namespace hzp::sim
