package guard

import "sync"

// names keeps the prefixed form of recently used keys. Keys repeat (job
// names, account ids under contention), and building prefix+key anew was one
// allocation of every acquisition. The table is bounded: once full, further
// keys are built each time rather than kept.
type names struct {
	mu sync.RWMutex
	m  map[string]string
}

// maxNames bounds the table: about 100 KiB for keys of typical length.
const maxNames = 1024

func (n *names) full(prefix, key string) string {
	if prefix == "" {
		return key
	}
	n.mu.RLock()
	full, ok := n.m[key]
	n.mu.RUnlock()
	if ok {
		return full
	}
	full = prefix + key
	n.mu.Lock()
	if n.m == nil {
		n.m = make(map[string]string)
	}
	if len(n.m) < maxNames {
		n.m[key] = full
	}
	n.mu.Unlock()
	return full
}
