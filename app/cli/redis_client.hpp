#pragma once
// A small RAII client over hiredis for `gpuphot worker` / `enqueue` / `results` (docs/CLI.md §Redis):
// one blocking connection with a connect and a command timeout, commands given as argv (binary safe,
// no format strings), replies owned by RedisReply. Every failure is an IoError naming HOST:PORT.
// Built only when hiredis was found (GPUPHOT_HAVE_HIREDIS); without it redisSupported() is false and
// RedisClient's constructor throws IoError saying so.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

struct redisContext;
struct redisReply;

namespace gpuphot::cli {

// True when this build links hiredis.
bool redisSupported();

// "HOST:PORT" or "HOST" (port 6379); "[::1]:6379" for IPv6. Throws InvalidInput naming --redis.
struct RedisAddress {
    std::string host = "127.0.0.1";
    int port = 6379;
    std::string str() const { return host + ":" + std::to_string(port); }
};
RedisAddress parseRedisAddress(const std::string& text);

// One reply (or one element of an array reply, which shares ownership of the whole reply).
class RedisReply {
public:
    RedisReply() = default;
    bool isNil() const;
    bool isError() const;
    bool isArray() const;
    bool isString() const; // bulk string or status
    bool isInteger() const;
    std::string str() const;                    // bulk string, status or error text; "" otherwise
    long long integer() const;                  // integer reply; also parses a numeric string; 0 otherwise
    std::size_t size() const;                   // elements of an array reply (0 otherwise)
    RedisReply operator[](std::size_t i) const; // element i of an array (throws std::out_of_range)
    // Flattened field/value pairs of an array of strings (stream entry fields, HGETALL).
    std::vector<std::pair<std::string, std::string>> pairs() const;

private:
    friend class RedisClient;
    RedisReply(std::shared_ptr<redisReply> root, const redisReply* node)
        : m_root(std::move(root)), m_node(node) {}
    std::shared_ptr<redisReply> m_root;
    const redisReply* m_node = nullptr;
};

class RedisClient {
public:
    // Connects within connectTimeout; every command then waits at most commandTimeout for its reply
    // (make it longer than any BLOCK given to XREADGROUP). Throws IoError naming HOST:PORT.
    explicit RedisClient(const RedisAddress& address,
                         std::chrono::milliseconds connectTimeout = std::chrono::milliseconds(5000),
                         std::chrono::milliseconds commandTimeout = std::chrono::milliseconds(30000));
    ~RedisClient();
    RedisClient(const RedisClient&) = delete;
    RedisClient& operator=(const RedisClient&) = delete;

    // Sends one command; an error reply throws IoError ("redis HOST:PORT: CMD: message").
    RedisReply command(const std::vector<std::string>& argv);
    // As command(), but an error reply is returned (isError()) instead of thrown; connection and
    // protocol failures still throw.
    RedisReply commandAllowError(const std::vector<std::string>& argv);
    const RedisAddress& address() const { return m_address; }

private:
    RedisAddress m_address;
    redisContext* m_ctx = nullptr;
};

} // namespace gpuphot::cli
