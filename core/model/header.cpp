#include "core/model/header.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/util/text.hpp"

namespace gpuphot {
namespace {

std::string upperKey(std::string_view key) {
    std::string k(key);
    for (char& c : k) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    while (!k.empty() && k.back() == ' ') k.pop_back();
    return k;
}

std::string_view trim(std::string_view s) {
    return trimView(s);
}

bool isCommentary(std::string_view key) { return key == "COMMENT" || key == "HISTORY" || key.empty(); }

std::string formatDouble(double v) {
    if (std::isnan(v)) return "'NaN'"; // FITS has no NaN literal: keep it readable and round-trippable
    if (std::isinf(v)) return v > 0 ? "'Inf'" : "'-Inf'";
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17G", v);
    std::string s(buf);
    if (s.find_first_of(".EN") == std::string::npos) s += ".0";
    return s;
}

} // namespace

std::optional<double> parseFitsNumber(std::string_view text) {
    text = trim(text);
    if (text.empty()) return std::nullopt;
    if (text.front() == '\'') {
        std::string s = unquoteFitsString(text);
        if (s == "NaN" || s == "nan" || s == "NAN") return std::nan("");
        if (s == "Inf" || s == "inf") return INFINITY;
        if (s == "-Inf" || s == "-inf") return -INFINITY;
        text = trim(s);
        // One level of quotes only: a quoted quoted value is not a number (and nested quotes must not
        // recurse without bound: the fuzzer's stack overflow on a card of many quotes).
        if (text.empty() || text.front() == '\'') return std::nullopt;
        std::string copy(text);
        return parseFitsNumber(copy);
    }
    std::string s(text);
    for (char& c : s)
        if (c == 'D' || c == 'd') c = 'E';
    double v = 0;
    const char* b = s.data();
    if (*b == '+') ++b;
    auto [ptr, ec] = std::from_chars(b, s.data() + s.size(), v);
    if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
    return v;
}

std::string unquoteFitsString(std::string_view text) {
    text = trim(text);
    if (text.size() < 2 || text.front() != '\'') return std::string(text);
    std::string out;
    for (std::size_t i = 1; i < text.size(); ++i) {
        if (text[i] == '\'') {
            if (i + 1 < text.size() && text[i + 1] == '\'') {
                out += '\'';
                ++i;
                continue;
            }
            break;
        }
        out += text[i];
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out;
}

std::string quoteFitsString(std::string_view text) {
    std::string out = "'";
    for (char c : text) {
        out += c;
        if (c == '\'') out += '\'';
    }
    while (out.size() < 9) out += ' '; // FITS: at least 8 characters between the quotes
    out += '\'';
    return out;
}

HeaderCard* Header::findMutable(std::string_view key) {
    const std::string k = upperKey(key);
    for (auto& c : m_cards)
        if (c.key == k) return &c;
    return nullptr;
}

const HeaderCard* Header::find(std::string_view key) const {
    return const_cast<Header*>(this)->findMutable(key);
}

bool Header::has(std::string_view key) const { return find(key) != nullptr; }

void Header::setRaw(std::string_view key, std::string_view valueText, std::string_view comment) {
    std::string k = upperKey(key);
    if (!isCommentary(k)) {
        if (HeaderCard* c = findMutable(k)) {
            c->value = std::string(valueText);
            if (!comment.empty()) c->comment = std::string(comment);
            return;
        }
    }
    m_cards.push_back({std::move(k), std::string(valueText), std::string(comment)});
}

void Header::set(std::string_view key, double value, std::string_view comment) {
    setRaw(key, formatDouble(value), comment);
}
void Header::set(std::string_view key, long long value, std::string_view comment) {
    setRaw(key, std::to_string(value), comment);
}
void Header::set(std::string_view key, bool value, std::string_view comment) {
    setRaw(key, value ? "T" : "F", comment);
}
void Header::set(std::string_view key, std::string_view value, std::string_view comment) {
    setRaw(key, quoteFitsString(value), comment);
}
void Header::addComment(std::string_view text) { m_cards.push_back({"COMMENT", "", std::string(text)}); }
void Header::addHistory(std::string_view text) { m_cards.push_back({"HISTORY", "", std::string(text)}); }

bool Header::remove(std::string_view key) {
    const std::string k = upperKey(key);
    auto it = std::remove_if(m_cards.begin(), m_cards.end(), [&](const HeaderCard& c) { return c.key == k; });
    bool removed = it != m_cards.end();
    m_cards.erase(it, m_cards.end());
    return removed;
}

std::optional<std::string> Header::getString(std::string_view key) const {
    const HeaderCard* c = find(key);
    if (!c) return std::nullopt;
    return unquoteFitsString(c->value);
}

std::optional<double> Header::getDouble(std::string_view key) const {
    const HeaderCard* c = find(key);
    if (!c) return std::nullopt;
    return parseFitsNumber(c->value);
}

std::optional<long long> Header::getInt(std::string_view key) const {
    auto v = getDouble(key);
    if (!v || !std::isfinite(*v) || std::floor(*v) != *v || std::fabs(*v) > 9.0e18) return std::nullopt;
    return static_cast<long long>(*v);
}

std::optional<bool> Header::getBool(std::string_view key) const {
    const HeaderCard* c = find(key);
    if (!c) return std::nullopt;
    std::string_view v = trim(c->value);
    if (v == "T") return true;
    if (v == "F") return false;
    return std::nullopt;
}

std::optional<double> Header::firstDouble(const std::vector<std::string>& keys, std::string* which) const {
    for (const auto& k : keys)
        if (auto v = getDouble(k)) {
            if (which) *which = k;
            return v;
        }
    return std::nullopt;
}

std::optional<std::string> Header::firstString(const std::vector<std::string>& keys, std::string* which) const {
    for (const auto& k : keys)
        if (auto v = getString(k)) {
            if (which) *which = k;
            return v;
        }
    return std::nullopt;
}

void Header::inheritFrom(const Header& primary) {
    static const char* structural[] = {"SIMPLE", "BITPIX", "EXTEND", "PCOUNT", "GCOUNT", "XTENSION",
                                       "CHECKSUM", "DATASUM", "INHERIT", "END", "BSCALE", "BZERO", "BLANK"};
    for (const auto& c : primary.m_cards) {
        if (isCommentary(c.key)) continue;
        if (std::any_of(std::begin(structural), std::end(structural), [&](const char* s) { return c.key == s; }))
            continue;
        if (c.key.rfind("NAXIS", 0) == 0) continue;
        if (!has(c.key)) m_cards.push_back(c);
    }
}

void Header::update(const Header& other) {
    for (const auto& c : other.m_cards) {
        if (isCommentary(c.key))
            m_cards.push_back(c);
        else
            setRaw(c.key, c.value, c.comment);
    }
}

std::string Header::formatCard(const HeaderCard& c) {
    std::string card;
    if (c.key == "COMMENT" || c.key == "HISTORY" || c.key.empty()) {
        card = c.key;
        card.resize(8, ' ');
        card += c.comment;
    } else if (c.key.size() > 8) {
        card = "HIERARCH " + c.key + " = " + c.value;
        if (!c.comment.empty()) card += " / " + c.comment;
    } else {
        card = c.key;
        card.resize(8, ' ');
        card += "= ";
        std::string v = c.value;
        if (!v.empty() && v.front() != '\'' && v.size() < 20) v.insert(0, 20 - v.size(), ' ');
        card += v;
        if (!c.comment.empty()) card += " / " + c.comment;
    }
    card.resize(80, ' ');
    return card;
}

std::string Header::toFitsString() const {
    std::string s;
    s.reserve(m_cards.size() * 80);
    for (const auto& c : m_cards) s += formatCard(c);
    return s;
}

Header Header::fromFitsString(std::string_view text) {
    Header h;
    for (std::size_t pos = 0; pos + 8 <= text.size(); pos += 80) {
        std::string_view card = text.substr(pos, std::min<std::size_t>(80, text.size() - pos));
        std::string key(trim(card.substr(0, 8)));
        if (key == "END") break;
        if (key == "COMMENT" || key == "HISTORY" || key.empty()) {
            std::string_view rest = card.size() > 8 ? card.substr(8) : std::string_view{};
            while (!rest.empty() && rest.back() == ' ') rest.remove_suffix(1);
            if (key.empty() && rest.empty()) continue;
            h.m_cards.push_back({key, "", std::string(rest)});
            continue;
        }
        std::string_view body;
        if (key == "HIERARCH") {
            std::string_view rest = card.substr(8);
            auto eq = rest.find('=');
            if (eq == std::string_view::npos) continue;
            key = upperKey(trim(rest.substr(0, eq)));
            body = rest.substr(eq + 1);
        } else {
            if (card.size() < 10 || card.substr(8, 2) != "= ") {
                h.m_cards.push_back({key, "", std::string(trim(card.substr(8)))});
                continue;
            }
            body = card.substr(10);
        }
        // Split value and comment: a '/' outside a quoted string starts the comment.
        std::size_t i = 0;
        bool inQuote = false;
        for (; i < body.size(); ++i) {
            if (body[i] == '\'') inQuote = !inQuote;
            else if (body[i] == '/' && !inQuote) break;
        }
        std::string value(trim(body.substr(0, i)));
        std::string comment = i < body.size() ? std::string(trim(body.substr(i + 1))) : std::string();
        h.m_cards.push_back({key, value, comment});
    }
    return h;
}

} // namespace gpuphot
