#pragma once
// Types that travel through the workbench's queued signals, declared to Qt's meta-type system once,
// before any moc-generated code uses them.
#include <QMetaType>

#include <memory>

#include "core/pipeline/pipeline_config.hpp"
#include "ui/snapshot.hpp"

namespace gpuphot::ui {
using FramePtr = std::shared_ptr<const Frame>;
using ReferencePtr = std::shared_ptr<const ReferenceCatalog>;
} // namespace gpuphot::ui

Q_DECLARE_METATYPE(gpuphot::PipelineConfig)
Q_DECLARE_METATYPE(gpuphot::ui::FramePtr)
Q_DECLARE_METATYPE(gpuphot::ui::ReferencePtr)
