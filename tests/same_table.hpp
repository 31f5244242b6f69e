#pragma once
// Two catalogs compared column by column, bit for bit (NaNs included): for checks that two ways of making a
// catalog (backends, schedules, engines) give the same bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "core/catalog/table.hpp"

namespace gpuphot::test {

inline void expectSameTable(const Table& a, const Table& b) {
    ASSERT_EQ(a.columns().size(), b.columns().size());
    ASSERT_EQ(a.rows(), b.rows());
    for (std::size_t k = 0; k < a.columns().size(); ++k) {
        const Column& ca = a.columns()[k];
        const Column& cb = b.columns()[k];
        ASSERT_EQ(ca.name, cb.name);
        ASSERT_EQ(ca.data.index(), cb.data.index()) << ca.name;
        std::visit(
            [&](const auto& va) {
                using V = std::decay_t<decltype(va)>;
                const V& vb = std::get<V>(cb.data);
                if constexpr (std::is_same_v<V, std::vector<std::string>>)
                    EXPECT_EQ(va, vb) << ca.name;
                else
                    EXPECT_EQ(std::memcmp(va.data(), vb.data(), va.size() * sizeof(va[0])), 0) << ca.name;
            },
            ca.data);
    }
}

} // namespace gpuphot::test
