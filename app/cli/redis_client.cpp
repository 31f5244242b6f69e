#include "app/cli/redis_client.hpp"

#include <cstdlib>
#include <stdexcept>

#include "core/util/errors.hpp"

#ifdef GPUPHOT_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#endif

namespace gpuphot::cli {

RedisAddress parseRedisAddress(const std::string& text) {
    auto bad = [&text](const std::string& why) {
        return InvalidInput("--redis '" + text + "': " + why + " (expected HOST:PORT, e.g. 127.0.0.1:6379)");
    };
    if (text.empty()) throw bad("empty");
    RedisAddress a;
    std::string portText;
    if (text.front() == '[') { // [v6]:port
        const auto close = text.find(']');
        if (close == std::string::npos) throw bad("unclosed '['");
        a.host = text.substr(1, close - 1);
        if (close + 1 < text.size()) {
            if (text[close + 1] != ':') throw bad("expected ':' after ']'");
            portText = text.substr(close + 2);
        }
    } else {
        const auto colon = text.rfind(':');
        if (colon == std::string::npos) {
            a.host = text;
        } else {
            a.host = text.substr(0, colon);
            portText = text.substr(colon + 1);
        }
    }
    if (a.host.empty()) throw bad("no host");
    if (!portText.empty()) {
        char* end = nullptr;
        const long p = std::strtol(portText.c_str(), &end, 10);
        if (*end != '\0' || p <= 0 || p > 65535) throw bad("port '" + portText + "' is not in 1..65535");
        a.port = static_cast<int>(p);
    }
    return a;
}

#ifdef GPUPHOT_HAVE_HIREDIS

bool redisSupported() {
    return true;
}

bool RedisReply::isNil() const {
    return !m_node || m_node->type == REDIS_REPLY_NIL;
}
bool RedisReply::isError() const {
    return m_node && m_node->type == REDIS_REPLY_ERROR;
}
bool RedisReply::isArray() const {
    return m_node && m_node->type == REDIS_REPLY_ARRAY;
}
bool RedisReply::isString() const {
    return m_node && (m_node->type == REDIS_REPLY_STRING || m_node->type == REDIS_REPLY_STATUS);
}
bool RedisReply::isInteger() const {
    return m_node && m_node->type == REDIS_REPLY_INTEGER;
}

std::string RedisReply::str() const {
    if (!m_node) return {};
    if (m_node->type == REDIS_REPLY_STRING || m_node->type == REDIS_REPLY_STATUS ||
        m_node->type == REDIS_REPLY_ERROR)
        return std::string(m_node->str, m_node->len);
    return {};
}

long long RedisReply::integer() const {
    if (!m_node) return 0;
    if (m_node->type == REDIS_REPLY_INTEGER) return m_node->integer;
    if (m_node->type == REDIS_REPLY_STRING) return std::strtoll(str().c_str(), nullptr, 10);
    return 0;
}

std::size_t RedisReply::size() const {
    return isArray() ? m_node->elements : 0;
}

RedisReply RedisReply::operator[](std::size_t i) const {
    if (i >= size())
        throw std::out_of_range("redis reply: element " + std::to_string(i) + " of " +
                                std::to_string(size()));
    return RedisReply(m_root, m_node->element[i]);
}

std::vector<std::pair<std::string, std::string>> RedisReply::pairs() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (std::size_t i = 0; i + 1 < size(); i += 2)
        out.emplace_back((*this)[i].str(), (*this)[i + 1].str());
    return out;
}

namespace {
timeval toTimeval(std::chrono::milliseconds ms) {
    timeval tv{};
    tv.tv_sec = static_cast<long>(ms.count() / 1000);
    tv.tv_usec = static_cast<long>((ms.count() % 1000) * 1000);
    return tv;
}
} // namespace

RedisClient::RedisClient(const RedisAddress& address, std::chrono::milliseconds connectTimeout,
                         std::chrono::milliseconds commandTimeout)
    : m_address(address) {
    m_ctx = redisConnectWithTimeout(address.host.c_str(), address.port, toTimeval(connectTimeout));
    if (!m_ctx) throw IoError("redis " + address.str() + ": cannot allocate a connection");
    if (m_ctx->err) {
        const std::string why = m_ctx->errstr;
        redisFree(m_ctx);
        m_ctx = nullptr;
        throw IoError("redis " + address.str() + ": cannot connect: " + why);
    }
    if (redisSetTimeout(m_ctx, toTimeval(commandTimeout)) != REDIS_OK) {
        redisFree(m_ctx);
        m_ctx = nullptr;
        throw IoError("redis " + address.str() + ": cannot set the command timeout");
    }
}

RedisClient::~RedisClient() {
    if (m_ctx) redisFree(m_ctx);
}

RedisReply RedisClient::commandAllowError(const std::vector<std::string>& argv) {
    const std::string name = argv.empty() ? std::string("(empty)") : argv.front();
    if (!m_ctx || m_ctx->err)
        throw IoError("redis " + m_address.str() + ": " + name + ": the connection is broken" +
                      (m_ctx ? std::string(" (") + m_ctx->errstr + ")" : std::string()));
    std::vector<const char*> args;
    std::vector<std::size_t> lens;
    for (const auto& a : argv) {
        args.push_back(a.data());
        lens.push_back(a.size());
    }
    void* raw = redisCommandArgv(m_ctx, static_cast<int>(args.size()), args.data(), lens.data());
    if (!raw)
        throw IoError("redis " + m_address.str() + ": " + name + ": " +
                      (m_ctx->err ? std::string(m_ctx->errstr) : std::string("no reply")));
    std::shared_ptr<redisReply> root(static_cast<redisReply*>(raw),
                                     [](redisReply* r) { freeReplyObject(r); });
    const redisReply* node = root.get();
    return RedisReply(std::move(root), node);
}

RedisReply RedisClient::command(const std::vector<std::string>& argv) {
    RedisReply r = commandAllowError(argv);
    if (r.isError()) throw IoError("redis " + m_address.str() + ": " + argv.front() + ": " + r.str());
    return r;
}

#else // no hiredis in this build

bool redisSupported() {
    return false;
}
bool RedisReply::isNil() const {
    return true;
}
bool RedisReply::isError() const {
    return false;
}
bool RedisReply::isArray() const {
    return false;
}
bool RedisReply::isString() const {
    return false;
}
bool RedisReply::isInteger() const {
    return false;
}
std::string RedisReply::str() const {
    return {};
}
long long RedisReply::integer() const {
    return 0;
}
std::size_t RedisReply::size() const {
    return 0;
}
RedisReply RedisReply::operator[](std::size_t) const {
    throw std::out_of_range("redis reply: no hiredis");
}
std::vector<std::pair<std::string, std::string>> RedisReply::pairs() const {
    return {};
}

RedisClient::RedisClient(const RedisAddress& address, std::chrono::milliseconds, std::chrono::milliseconds)
    : m_address(address) {
    throw IoError("redis " + address.str() +
                  ": this build of gpuphot has no Redis support (it was built without hiredis: install "
                  "libhiredis-dev and rebuild)");
}
RedisClient::~RedisClient() = default;
RedisReply RedisClient::commandAllowError(const std::vector<std::string>&) {
    return {};
}
RedisReply RedisClient::command(const std::vector<std::string>&) {
    return {};
}

#endif

} // namespace gpuphot::cli
