#include <gtest/gtest.h>

#include <cmath>

#include "core/model/header.hpp"

using namespace gpuphot;

TEST(Header, TypedSetGetRoundTrip) {
    Header h;
    h.set("GAIN", 1.25, "e-/ADU");
    h.set("NCOMBINE", 7);
    h.set("INHERIT", true);
    h.set("FILTER", "r'");
    EXPECT_DOUBLE_EQ(*h.getDouble("gain"), 1.25);
    EXPECT_EQ(*h.getInt("NCOMBINE"), 7);
    EXPECT_TRUE(*h.getBool("INHERIT"));
    EXPECT_EQ(*h.getString("FILTER"), "r'");
    h.set("GAIN", 2.0);
    EXPECT_EQ(h.size(), 4u) << "set replaces an existing key";
    EXPECT_FALSE(h.getDouble("FILTER").has_value());
}

TEST(Header, FitsStringRoundTripKeepsValuesAndComments) {
    Header h;
    h.set("EXPTIME", 120.0, "[s] exposure");
    h.set("OBJECT", "M 42 'Orion'");
    h.set("NANVAL", std::nan(""));
    h.addHistory("reduced by gpuphot");
    const std::string s = h.toFitsString();
    ASSERT_EQ(s.size() % 80, 0u);
    Header back = Header::fromFitsString(s + std::string("END") + std::string(77, ' '));
    ASSERT_EQ(back.size(), h.size());
    EXPECT_DOUBLE_EQ(*back.getDouble("EXPTIME"), 120.0);
    EXPECT_EQ(back.find("EXPTIME")->comment, "[s] exposure");
    EXPECT_EQ(*back.getString("OBJECT"), "M 42 'Orion'");
    EXPECT_TRUE(std::isnan(*back.getDouble("NANVAL")));
    EXPECT_EQ(back.cards().back().key, "HISTORY");
}

TEST(Header, ParsesFortranExponentAndRejectsText) {
    EXPECT_DOUBLE_EQ(*parseFitsNumber("1.5D3"), 1500.0);
    EXPECT_DOUBLE_EQ(*parseFitsNumber(" +42 "), 42.0);
    EXPECT_FALSE(parseFitsNumber("'abc'").has_value());
    EXPECT_FALSE(parseFitsNumber("T").has_value());
}

TEST(Header, InheritSkipsStructuralAndExistingKeys) {
    Header primary, ext;
    primary.set("NAXIS", 0);
    primary.set("TELESCOP", "T80");
    primary.set("GAIN", 3.0);
    ext.set("GAIN", 1.5);
    ext.inheritFrom(primary);
    EXPECT_EQ(*ext.getString("TELESCOP"), "T80");
    EXPECT_DOUBLE_EQ(*ext.getDouble("GAIN"), 1.5);
    EXPECT_FALSE(ext.has("NAXIS"));
}
