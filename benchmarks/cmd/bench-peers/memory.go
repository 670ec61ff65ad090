package main

import (
	"context"
	"runtime/debug"
	"sync"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
)

// allSubjects lists every subject; the pairs pick among them.
func allSubjects(b *bench) []*subject {
	var out []*subject
	out = append(out, redisSubjects(b)...)
	out = append(out, sessionSubjects(b)...)
	out = append(out, postgresSubjects(b)...)
	out = append(out, consulSubjects(b)...)
	out = append(out, memorySubjects()...)
	return out
}

// memorySubjects are in-process: their workers are goroutines of one
// process sharing one lock table, since that is all such a lock can serve.
func memorySubjects() []*subject {
	return []*subject{
		{
			id: "warden-memory", label: "warden memory", group: "memory", warden: true, batch: 100,
			how: "guard.Do over memory.New(), one Guard shared by the goroutines",
			fixture: func(ctx context.Context, m *meter) (fixture, error) {
				g, err := guard.New(memory.New(), guardOptions()...)
				if err != nil {
					return nil, err
				}
				return perWorker(func(ctx context.Context) (worker, error) { return &guardWorker{g: g}, nil }), nil
			},
		},
		{
			id: "sync-mutex", label: "sync.Mutex", group: "memory", batch: 100,
			how: "one sync.Mutex per key shared by the goroutines: the floor of any in-process lock",
			fixture: func(ctx context.Context, m *meter) (fixture, error) {
				return &mutexTable{mutexes: map[string]*sync.Mutex{}}, nil
			},
		},
	}
}

// mutexTable is the sync.Mutex subject's shared state.
type mutexTable struct {
	mu      sync.Mutex
	mutexes map[string]*sync.Mutex
}

func (t *mutexTable) worker(context.Context) (worker, error) {
	return &mutexWorker{t: t, mine: map[string]*sync.Mutex{}}, nil
}

func (t *mutexTable) close() {}

// mutexWorker looks each key up in the shared table once, and then keeps the
// mutex: the cycle is then the mutex alone, as in a program holding one.
type mutexWorker struct {
	t    *mutexTable
	mine map[string]*sync.Mutex
}

func (w *mutexWorker) cycle(_ context.Context, key string, section func()) error {
	mu, ok := w.mine[key]
	if !ok {
		w.t.mu.Lock()
		if mu, ok = w.t.mutexes[key]; !ok {
			mu = new(sync.Mutex)
			w.t.mutexes[key] = mu
		}
		w.t.mu.Unlock()
		w.mine[key] = mu
	}
	mu.Lock()
	section()
	mu.Unlock()
	return nil
}

func (w *mutexWorker) close() {}

// modVersion is the version of a dependency this binary was built with.
func modVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == path {
				if d.Replace != nil {
					return d.Replace.Version
				}
				return d.Version
			}
		}
	}
	return ""
}
