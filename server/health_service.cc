// grpc.health.v1.Health: a map of service name -> serving, guarded by one mutex.
#include "health_service.h"

#include <chrono>

namespace traind::server {

using grpc::health::v1::HealthCheckResponse;

HealthService::HealthService() { serving_[""] = true; }

void HealthService::SetServingStatus(const std::string& service, bool serving) {
  {
    MutexLock lock(&mu_);
    if (shut_down_) return;
    serving_[service] = serving;
  }
  changed_.NotifyAll();
}

void HealthService::Shutdown() {
  {
    MutexLock lock(&mu_);
    shut_down_ = true;
    for (auto& [name, serving] : serving_) serving = false;
  }
  changed_.NotifyAll();
}

HealthService::ServingStatus HealthService::StatusOf(const std::string& service) const {
  auto it = serving_.find(service);
  if (it == serving_.end()) return HealthCheckResponse::SERVICE_UNKNOWN;
  return it->second ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
}

grpc::Status HealthService::Check(grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest* req,
                                  HealthCheckResponse* resp) {
  MutexLock lock(&mu_);
  const ServingStatus status = StatusOf(req->service());
  if (status == HealthCheckResponse::SERVICE_UNKNOWN)
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service " + req->service());
  resp->set_status(status);
  return grpc::Status::OK;
}

grpc::Status HealthService::Watch(grpc::ServerContext* ctx, const grpc::health::v1::HealthCheckRequest* req,
                                  grpc::ServerWriter<HealthCheckResponse>* writer) {
  bool first = true;
  ServingStatus sent = HealthCheckResponse::UNKNOWN;
  while (!ctx->IsCancelled()) {
    ServingStatus now;
    {
      MutexLock lock(&mu_);
      now = StatusOf(req->service());
      if (!first && now == sent) {
        if (shut_down_) return grpc::Status::OK;
        // Cancellation is not a notification here: look again every second.
        changed_.WaitFor(&mu_, std::chrono::seconds(1));
        continue;
      }
    }
    HealthCheckResponse resp;
    resp.set_status(now);
    if (!writer->Write(resp)) break;
    first = false;
    sent = now;
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
}

}  // namespace traind::server
