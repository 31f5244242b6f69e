#pragma once
// Light curves off the UI thread for the workbench's light-curve panel: the same buildSeries and
// appendSeries `gpuphot series` calls (core/series), over a list of reduced catalogs, for the panel's
// targets and parameters. When only catalogs were added since the last result (a followed folder's new
// frame), the series is appended to; any other change rebuilds it. Requests coalesce: while one job
// runs, the newest request waits and runs next; a result that a waiting rebuild supersedes is dropped;
// results arrive on the UI thread, immutable.
#include <QObject>
#include <QString>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/io/target_list.hpp"
#include "core/series/series.hpp"

class QThread;

namespace gpuphot::ui {

using SeriesResultPtr = std::shared_ptr<const SeriesResult>;

class SeriesRunner : public QObject {
    Q_OBJECT
public:
    explicit SeriesRunner(QObject* parent = nullptr);
    ~SeriesRunner() override; // waits for the running job

    // Each setter schedules a run (nothing runs without catalogs and targets).
    void setCatalogs(std::vector<std::string> catalogs);
    void addCatalog(const std::string& catalog); // ignored when already listed
    void setTargets(TargetList targets);
    void setParams(SeriesParams params);
    void setInputs(TargetList targets, SeriesParams params); // both at once: one run
    void rerun();                                            // rebuilds with the current inputs

    const std::vector<std::string>& catalogs() const { return m_catalogs; }
    const TargetList& targets() const { return m_targets; }
    const SeriesParams& params() const { return m_params; }
    SeriesResultPtr result() const { return m_result; }
    bool busy() const { return m_thread != nullptr; }

signals:
    void started();
    void resultReady(gpuphot::ui::SeriesResultPtr result);
    void failed(const QString& message);

private:
    struct Job {
        std::vector<std::string> catalogs;
        TargetList targets;
        SeriesParams params;
        std::optional<SeriesState> state; // set: append the catalogs it has not seen
        std::vector<std::string> newOnes; // the catalogs to append
    };
    void schedule(bool rebuild);
    void startNext();
    void finished(SeriesResultPtr result, const QString& error, const std::vector<std::string>& catalogs);
    static SeriesResultPtr run(Job& job);

    std::vector<std::string> m_catalogs;
    TargetList m_targets;
    SeriesParams m_params;
    SeriesResultPtr m_result;
    std::vector<std::string> m_resultCatalogs; // the catalogs m_result was made from
    bool m_pending = false, m_rebuild = true;
    QThread* m_thread = nullptr;
};

} // namespace gpuphot::ui

Q_DECLARE_METATYPE(gpuphot::ui::SeriesResultPtr)
