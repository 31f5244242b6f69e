#pragma once
// The two back ends of openResultsStore (core/db internal).
#include <memory>
#include <string>

#include "core/db/results_store.hpp"

namespace gpuphot::db {

std::unique_ptr<ResultsStore> openSqliteStore(const std::string& path, const StoreOptions& options);
std::unique_ptr<ResultsStore> openPostgresStore(const std::string& url, const StoreOptions& options);

} // namespace gpuphot::db
