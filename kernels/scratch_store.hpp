#pragma once
// Per-stage working state kept in a DeviceContext between calls (DeviceContext::scratch), one object per
// type: each stage names its own struct (its resident inputs, host working memory, GrowingPinned download
// buffers), so that no two stages can share or mistake an entry.
#include <cstddef>
#include <memory>
#include <typeindex>
#include <typeinfo>
#include <utility>
#include <vector>

namespace gpuphot::cuda {

class ScratchStore {
public:
    ScratchStore() = default;
    ~ScratchStore() { clear(); }
    ScratchStore(const ScratchStore&) = delete;
    ScratchStore& operator=(const ScratchStore&) = delete;

    // The T of this store, value-initialised on first use; it stays at the same address until clear().
    // Not thread-safe (the stage thread's).
    template <class T> T& get() {
        const std::type_index key(typeid(T));
        for (Entry& e : m_entries)
            if (e.type == key) return *static_cast<T*>(e.object.get());
        Holder object(new T(), [](void* p) { delete static_cast<T*>(p); });
        m_entries.push_back(Entry{key, std::move(object)});
        return *static_cast<T*>(m_entries.back().object.get());
    }
    // Destroys every object, the last made first.
    void clear() noexcept {
        while (!m_entries.empty())
            m_entries.pop_back();
    }
    std::size_t size() const { return m_entries.size(); }

private:
    using Holder = std::unique_ptr<void, void (*)(void*)>;
    struct Entry {
        std::type_index type;
        Holder object;
    };
    std::vector<Entry> m_entries;
};

} // namespace gpuphot::cuda
