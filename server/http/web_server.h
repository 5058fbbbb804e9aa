// WebServer: traind's own web page (--http-listen). `GET /` serves the page (embedded in the
// binary, no token); the JSON endpoints under /api/ need `Authorization: Bearer <token>`, checked
// by the same TokenAuth as gRPC, and read the same JobManager (job records and event log):
//   GET  /api/whoami                      {"user":..}
//   GET  /api/jobs                        {"jobs":[rows]}   the caller's jobs, newest first
//   GET  /api/jobs/ID                     {"job":detail}
//   GET  /api/jobs/ID/events?from=N       {"events":[..],"next":N'}  at most 2000 per call
//   POST /api/jobs/ID/cancel              {"job":row}
// Errors: {"error":"one sentence"} with 401 (no or wrong token), 404 (no such job of the caller's),
// 400, 503. With a certificate and key it serves HTTPS only (the gRPC --tls-cert/--tls-key).
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "auth.h"
#include "job_manager.h"
#include "traind/engine/status.h"

namespace httplib {
class Server;
}

namespace traind::server::http {

struct WebOptions {
  std::string listen = "127.0.0.1:8080";  // host:port; port 0 picks a free one
  std::string tls_cert, tls_key;          // PEM files: HTTPS (both or neither)
  double peak_flops = 0;                  // denominator of the MFU column
};

class WebServer {
 public:
  // Binds and starts serving on its own threads. UNAVAILABLE when the address cannot be bound,
  // INVALID_ARGUMENT for a malformed address or unreadable certificate. `jobs` and `auth` must
  // outlive the server.
  static Result<std::unique_ptr<WebServer>> Start(const WebOptions& options, JobManager* jobs,
                                                  const TokenAuth* auth);
  ~WebServer();  // Stop()
  void Stop();   // idempotent
  int port() const { return port_; }

 private:
  WebServer() = default;
  void Routes();

  WebOptions options_;
  JobManager* jobs_ = nullptr;
  const TokenAuth* auth_ = nullptr;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

// The embedded page (web_assets.cc, generated from server/http/assets/index.html).
extern const char* const kIndexHtml;

}  // namespace traind::server::http
