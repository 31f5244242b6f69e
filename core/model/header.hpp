#pragma once
// An ordered FITS header: the cards of one HDU (plus, for INHERIT = T extensions, the primary
// header's cards that the extension does not override). Values are kept as FITS value text so that
// nothing is lost in a read/write round trip; typed getters parse them.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuphot {

struct HeaderCard {
    std::string key;     // upper case, up to 8 characters (longer HIERARCH keys are kept verbatim)
    std::string value;   // FITS value text: 'string', 1.5, 42, T/F; empty for COMMENT/HISTORY/blank
    std::string comment; // for COMMENT/HISTORY: the text
};

class Header {
public:
    // Typed setters replace an existing card of the same key (COMMENT/HISTORY always append).
    void set(std::string_view key, double value, std::string_view comment = {});
    void set(std::string_view key, long long value, std::string_view comment = {});
    void set(std::string_view key, int value, std::string_view comment = {}) { set(key, static_cast<long long>(value), comment); }
    void set(std::string_view key, bool value, std::string_view comment = {});
    void set(std::string_view key, std::string_view value, std::string_view comment = {});
    void set(std::string_view key, const char* value, std::string_view comment = {}) { set(key, std::string_view(value), comment); }
    void setRaw(std::string_view key, std::string_view valueText, std::string_view comment = {});
    void addComment(std::string_view text);
    void addHistory(std::string_view text);
    bool remove(std::string_view key); // removes every card with this key

    bool has(std::string_view key) const;
    const HeaderCard* find(std::string_view key) const;
    std::optional<std::string> getString(std::string_view key) const; // quotes stripped, trailing blanks trimmed
    std::optional<double> getDouble(std::string_view key) const;      // also parses integer and 'quoted' numbers
    std::optional<long long> getInt(std::string_view key) const;
    std::optional<bool> getBool(std::string_view key) const;
    // The first key of `keys` that is present and parses as a number.
    std::optional<double> firstDouble(const std::vector<std::string>& keys, std::string* which = nullptr) const;
    std::optional<std::string> firstString(const std::vector<std::string>& keys, std::string* which = nullptr) const;

    const std::vector<HeaderCard>& cards() const { return m_cards; }
    std::size_t size() const { return m_cards.size(); }

    // Appends the cards of `other` whose keys this header lacks (INHERIT = T semantics; structural
    // keywords SIMPLE, BITPIX, NAXISn, EXTEND, PCOUNT, GCOUNT, XTENSION, CHECKSUM, DATASUM excluded).
    void inheritFrom(const Header& primary);
    // Merges `other` in, replacing cards with the same key (used to write a WCS into a header).
    void update(const Header& other);

    // One 80-character card, as FITS writes it.
    static std::string formatCard(const HeaderCard& card);
    // All cards as 80-character records, without END (what wcspih and fits_hdr2str exchange).
    std::string toFitsString() const;
    // Parses concatenated 80-character records (stops at END).
    static Header fromFitsString(std::string_view text);

private:
    HeaderCard* findMutable(std::string_view key);
    std::vector<HeaderCard> m_cards;
};

// Parses a FITS value text ('abc', 1.5D3, 42, T). Returns nullopt when it is not of that type.
std::optional<double> parseFitsNumber(std::string_view valueText);
std::string unquoteFitsString(std::string_view valueText);
std::string quoteFitsString(std::string_view text);

} // namespace gpuphot
