// traind's web page and its JSON endpoints (see web_server.h), on cpp-httplib (Debian's
// libcpp-httplib-dev, built with OpenSSL for HTTPS).
#include "http/web_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <fstream>

#include "http/job_json.h"

namespace traind::server::http {

namespace {

void SendJson(httplib::Response& res, int code, const nlohmann::json& body) {
  res.status = code;
  res.set_header("Cache-Control", "no-store");
  res.set_content(body.dump(), "application/json");
}

void SendError(httplib::Response& res, const Status& s) {
  int code = 500;
  switch (s.code()) {
    case Status::Code::kUnauthenticated: code = 401; break;
    case Status::Code::kNotFound: code = 404; break;
    case Status::Code::kInvalidArgument: code = 400; break;
    case Status::Code::kFailedPrecondition: code = 409; break;
    case Status::Code::kUnavailable: code = 503; break;
    default: break;
  }
  if (code == 401) res.set_header("WWW-Authenticate", "Bearer");
  SendJson(res, code, {{"error", s.message()}});
}

// The newest `window` events of a job (fewer when it has fewer), read through JobManager::Watch.
std::vector<v1::JobEvent> RecentEvents(JobManager* jobs, const std::string& user, const v1::Job& job,
                                       int64_t window) {
  std::vector<v1::JobEvent> out;
  v1::WatchJobRequest req;
  req.set_id(job.id());
  req.set_from_sequence(std::max<int64_t>(1, job.last_sequence() - window + 1));
  (void)jobs->Watch(user, req, [&](const v1::JobEvent& ev, bool) { out.push_back(ev); return true; },
                    [] { return false; });
  return out;
}

constexpr int64_t kStatsWindow = 64;     // events behind tokens/s, MFU and ETA
constexpr int64_t kMaxEventsPerCall = 2000;

}  // namespace

Result<std::unique_ptr<WebServer>> WebServer::Start(const WebOptions& options, JobManager* jobs,
                                                    const TokenAuth* auth) {
  std::unique_ptr<WebServer> ws(new WebServer());
  ws->options_ = options;
  ws->jobs_ = jobs;
  ws->auth_ = auth;
  const auto colon = options.listen.rfind(':');
  if (colon == std::string::npos) return Status::InvalidArgument("--http-listen: expected host:port, got " + options.listen);
  std::string host = options.listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  int port = 0;
  try {
    port = std::stoi(options.listen.substr(colon + 1));
  } catch (const std::exception&) {
    return Status::InvalidArgument("--http-listen: bad port in " + options.listen);
  }
  if (!options.tls_cert.empty()) {
    auto ssl = std::make_unique<httplib::SSLServer>(options.tls_cert.c_str(), options.tls_key.c_str());
    if (!ssl->is_valid())
      return Status::InvalidArgument("--http-listen: cannot load the TLS certificate " + options.tls_cert +
                                     " and key " + options.tls_key);
    ws->server_ = std::move(ssl);
  } else {
    ws->server_ = std::make_unique<httplib::Server>();
  }
  ws->Routes();
  if (port == 0) {
    ws->port_ = ws->server_->bind_to_any_port(host);
    if (ws->port_ <= 0) ws->port_ = 0;
  } else if (ws->server_->bind_to_port(host, port)) {
    ws->port_ = port;
  }
  if (ws->port_ == 0)
    return Status::Unavailable("cannot listen on " + options.listen + " for the web page (in use, or not an address of this host)");
  httplib::Server* srv = ws->server_.get();
  ws->thread_ = std::thread([srv] { srv->listen_after_bind(); });
  return ws;
}

WebServer::~WebServer() { Stop(); }

void WebServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void WebServer::Routes() {
  httplib::Server& s = *server_;
  JobManager* jobs = jobs_;
  const TokenAuth* auth = auth_;
  const double peak = options_.peak_flops;
  // The user behind the request's Authorization header, or a 401 already written.
  auto user_of = [auth](const httplib::Request& req, httplib::Response& res) -> std::string {
    Result<std::string> user = auth->Authenticate(req.get_header_value("Authorization"));
    if (!user.ok()) {
      SendError(res, user.status());
      return "";
    }
    return *user;
  };

  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_header("Cache-Control", "no-store");
    res.set_header("Content-Security-Policy",
                   "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:");
    res.set_content(kIndexHtml, "text/html; charset=utf-8");
  });
  s.Get("/api/whoami", [user_of](const httplib::Request& req, httplib::Response& res) {
    const std::string user = user_of(req, res);
    if (!user.empty()) SendJson(res, 200, {{"user", user}});
  });
  s.Get("/api/jobs", [=](const httplib::Request& req, httplib::Response& res) {
    const std::string user = user_of(req, res);
    if (user.empty()) return;
    nlohmann::json rows = nlohmann::json::array();
    int with_stats = 0;
    for (const v1::Job& job : jobs->List(user, 0)) {
      JobStats st;
      // Stats need the newest events; the 50 newest started jobs get them (a poll stays cheap).
      if (job.state() != v1::JOB_STATE_QUEUED && with_stats++ < 50)
        st = ComputeStats(job, RecentEvents(jobs, user, job, kStatsWindow), peak);
      rows.push_back(JobRowJson(job, st));
    }
    SendJson(res, 200, {{"jobs", rows}});
  });
  s.Get(R"(/api/jobs/([A-Za-z0-9._-]+))", [=](const httplib::Request& req, httplib::Response& res) {
    const std::string user = user_of(req, res);
    if (user.empty()) return;
    auto job = jobs->Get(user, req.matches[1]);
    if (!job.ok()) return SendError(res, job.status());
    SendJson(res, 200, {{"job", JobDetailJson(*job, ComputeStats(*job, RecentEvents(jobs, user, *job, kStatsWindow), peak))}});
  });
  s.Get(R"(/api/jobs/([A-Za-z0-9._-]+)/events)", [=](const httplib::Request& req, httplib::Response& res) {
    const std::string user = user_of(req, res);
    if (user.empty()) return;
    int64_t from = 1;
    if (req.has_param("from")) {
      try {
        from = std::stoll(req.get_param_value("from"));
      } catch (const std::exception&) {
        return SendError(res, Status::InvalidArgument("from: expected an event sequence number"));
      }
    }
    v1::WatchJobRequest wr;
    wr.set_id(req.matches[1]);
    wr.set_from_sequence(std::max<int64_t>(1, from));
    nlohmann::json events = nlohmann::json::array();
    int64_t next = std::max<int64_t>(1, from);
    Status st = jobs->Watch(user, wr, [&](const v1::JobEvent& ev, bool) {
      if (static_cast<int64_t>(events.size()) >= kMaxEventsPerCall) return false;
      events.push_back(EventJson(ev));
      next = ev.sequence() + 1;
      return true;
    }, [] { return false; });
    if (!st.ok() && st.code() != Status::Code::kCancelled) return SendError(res, st);
    SendJson(res, 200, {{"events", events}, {"next", next}});
  });
  s.Post(R"(/api/jobs/([A-Za-z0-9._-]+)/cancel)", [=](const httplib::Request& req, httplib::Response& res) {
    const std::string user = user_of(req, res);
    if (user.empty()) return;
    auto job = jobs->Cancel(user, req.matches[1]);
    if (!job.ok()) return SendError(res, job.status());
    spdlog::info("web: {} cancelled {}", user, job->id());
    SendJson(res, 200, {{"job", JobRowJson(*job, JobStats{})}});
  });
  s.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (res.body.empty()) res.set_content(nlohmann::json{{"error", "not found"}}.dump(), "application/json");
  });
}

}  // namespace traind::server::http
