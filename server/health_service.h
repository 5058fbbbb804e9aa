// HealthService: grpc.health.v1.Health for traind, in place of gRPC's default service, whose
// callback handlers would start the callback API's polling threads beside traind's one
// (job_service.h says why one). Same behaviour: service "" is traind as a whole, registered
// services answer SERVING or NOT_SERVING, an unknown one NOT_FOUND (Check) or SERVICE_UNKNOWN
// (Watch, which sends the status now and at every change).
#pragma once

#include <map>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"
#include "traind/engine/mutex.h"

namespace traind::server {

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  HealthService();  // service "" SERVING

  // Registers or updates `service`. No effect after Shutdown.
  void SetServingStatus(const std::string& service, bool serving) TRAIND_EXCLUDES(mu_);
  // Every registered service NOT_SERVING for good, and every Watch ends after sending it (so the
  // server's shutdown does not wait for them). Thread-safe.
  void Shutdown() TRAIND_EXCLUDES(mu_);

  grpc::Status Check(grpc::ServerContext* ctx, const grpc::health::v1::HealthCheckRequest* req,
                     grpc::health::v1::HealthCheckResponse* resp) override;
  grpc::Status Watch(grpc::ServerContext* ctx, const grpc::health::v1::HealthCheckRequest* req,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>* writer) override;

 private:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;
  ServingStatus StatusOf(const std::string& service) const TRAIND_REQUIRES(mu_);

  mutable Mutex mu_;
  CondVar changed_;  // a status changed, or Shutdown
  std::map<std::string, bool> serving_ TRAIND_GUARDED_BY(mu_);
  bool shut_down_ TRAIND_GUARDED_BY(mu_) = false;
};

}  // namespace traind::server
