// traind::client::Client: a small C++ client of traind's JobService (what trainctl uses; embed it
// in other services). Speaks traind/v1 messages; no gRPC type appears here. Errors come back as
// traind::Status with the daemon's code and message (UNAVAILABLE when traind cannot be reached,
// UNAUTHENTICATED for a missing or wrong token).
// Thread safety: a Client may be used from several threads at once.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "traind/engine/status.h"
#include "traind/v1/job_service.pb.h"

namespace traind::client {

struct ClientOptions {
  std::string addr = "127.0.0.1:50051";  // host:port
  std::string token;                     // bearer token; "" sends none
  bool tls = false;                      // connect with TLS
  std::string tls_ca_file;               // PEM roots for TLS; "" = the system's
  double timeout_seconds = 30;           // deadline of each unary call
  // A connection of this Client's own. By default gRPC shares one connection per address within a
  // process, so a Client made right after traind restarted may inherit a connection still in
  // reconnect backoff (its first calls fail UNAVAILABLE for up to a second or so).
  bool own_connection = false;
};

class Client {
 public:
  // Creates the channel (does not connect yet; the first call does).
  static Result<std::unique_ptr<Client>> Create(const ClientOptions& options);
  ~Client();

  // Reads a spec file and submits its text, with the current working directory as base_dir, so
  // relative paths in the spec mean what they mean to the user who typed them (as with HF scripts).
  Result<v1::Job> SubmitFile(const std::string& path, int32_t priority = 0);
  Result<v1::Job> Submit(const v1::SubmitJobRequest& request);
  Result<v1::Job> Get(const std::string& id);
  Result<std::vector<v1::Job>> List(int limit = 0);  // newest first
  Result<v1::Job> Cancel(const std::string& id);
  Result<v1::EstimateJobResponse> EstimateFile(const std::string& path);
  Result<v1::EstimateJobResponse> Estimate(const v1::EstimateJobRequest& request);
  // Text from a trained model, run by traind on its device. A relative output_dir is made
  // absolute against the current working directory here. Its deadline is the larger of
  // timeout_seconds and 11 minutes (traind stops a generation after 10).
  Result<v1::GenerateResponse> Generate(v1::GenerateRequest request);

  // Streams the job's events from `from_sequence` to `on_event` (return false to stop). With
  // `follow`, until the job ends; when the connection breaks (traind restarting) it reconnects
  // and resumes after the last event seen, for up to `reconnect_seconds`.
  Status Watch(const std::string& id, int64_t from_sequence, bool follow,
               const std::function<bool(const v1::JobEvent&)>& on_event, double reconnect_seconds = 60);

  // grpc.health.v1 Check of the service "" (no token needed). OK when SERVING.
  Status Health();

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Reads a whole file; NOT_FOUND with the path when it cannot be read.
Result<std::string> ReadFile(const std::string& path);

}  // namespace traind::client
