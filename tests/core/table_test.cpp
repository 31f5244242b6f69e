#include <gtest/gtest.h>

#include <cmath>

#include "core/catalog/table.hpp"
#include "core/util/errors.hpp"

using namespace gpuphot;

TEST(Table, AddFindAtAndRows) {
    Table t;
    EXPECT_EQ(t.rows(), 0u);
    t.add("x", std::vector<double>{1.5, 2.5, 3.5}, "pix", "centroid");
    t.add("flags", std::vector<std::int32_t>{0, 4, 1});
    t.add("label", std::vector<std::string>{"a", "b", "c"});
    EXPECT_EQ(t.rows(), 3u);
    ASSERT_EQ(t.columns().size(), 3u);
    ASSERT_NE(t.find("X"), nullptr) << "find is case-insensitive";
    EXPECT_EQ(t.find("X")->unit, "pix");
    EXPECT_EQ(t.find("x")->description, "centroid");
    EXPECT_EQ(t.find("nope"), nullptr);
    EXPECT_EQ(t.at("FLAGS").as<std::int32_t>()[1], 4);
    EXPECT_DOUBLE_EQ(t.at("x").asDouble(2), 3.5);
    EXPECT_TRUE(std::isnan(t.at("label").asDouble(0)));
    EXPECT_EQ(t.at("label").size(), 3u);
}

TEST(Table, ExactCaseWinsOverCaseInsensitiveMatch) {
    Table t;
    t.add("ra", std::vector<double>{1});
    t.add("dec", std::vector<double>{2});
    EXPECT_EQ(t.find("RA")->name, "ra");
    EXPECT_EQ(&t.at("dec"), t.find("DEC"));
}

TEST(Table, LengthMismatchThrowsInvalidInput) {
    Table t;
    t.name = "truth";
    t.add("a", std::vector<double>{1, 2, 3});
    try {
        t.add("b", std::vector<float>{1, 2});
        FAIL() << "expected InvalidInput";
    } catch (const InvalidInput& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("'b'"), std::string::npos) << m;
        EXPECT_NE(m.find("truth"), std::string::npos) << m;
    }
    EXPECT_EQ(t.columns().size(), 1u) << "a rejected column is not added";
}

TEST(Table, AddReplacesExistingColumn) {
    Table t;
    t.add("a", std::vector<double>{1, 2});
    t.add("b", std::vector<double>{3, 4});
    t.add("A", std::vector<std::int64_t>{7, 8}, "adu");
    ASSERT_EQ(t.columns().size(), 2u);
    EXPECT_EQ(t.at("a").as<std::int64_t>()[1], 8);
    EXPECT_EQ(t.at("a").unit, "adu");
    EXPECT_THROW(t.add("a", std::vector<double>{1, 2, 3}), InvalidInput) << "must still match b's length";
    // The only column may change length.
    Table single;
    single.add("a", std::vector<double>{1, 2});
    single.add("a", std::vector<double>{1, 2, 3});
    EXPECT_EQ(single.rows(), 3u);
}

TEST(Table, DoublesConvertsEveryNumericTypeAndRejectsStrings) {
    Table t;
    t.add("f", std::vector<float>{0.5f, -1.25f});
    t.add("i64", std::vector<std::int64_t>{-(std::int64_t(1) << 40), 3});
    t.add("i32", std::vector<std::int32_t>{-7, 9});
    t.add("i16", std::vector<std::int16_t>{-32768, 32767});
    t.add("u8", std::vector<std::uint8_t>{0, 255});
    t.add("s", std::vector<std::string>{"x", "y"});
    EXPECT_EQ(t.doubles("f"), (std::vector<double>{0.5, -1.25}));
    EXPECT_EQ(t.doubles("i64"), (std::vector<double>{-1099511627776.0, 3}));
    EXPECT_EQ(t.doubles("i32"), (std::vector<double>{-7, 9}));
    EXPECT_EQ(t.doubles("i16"), (std::vector<double>{-32768, 32767}));
    EXPECT_EQ(t.doubles("u8"), (std::vector<double>{0, 255}));
    EXPECT_THROW(t.doubles("s"), InvalidInput);
    try {
        t.doubles("missing");
        FAIL();
    } catch (const InvalidInput& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("missing"), std::string::npos);
        EXPECT_NE(m.find("i16"), std::string::npos) << "lists the available columns: " << m;
    }
}
