package guard

import (
	"sync"
	"sync/atomic"
)

// names keeps the prefixed form of recently used keys, which have passed
// ValidateKey. Keys repeat (job names, account ids under contention), and
// building prefix+key anew was one allocation of every acquisition, and
// validating it a pass over its bytes. Reads take no lock and write no
// shared memory, so goroutines contending for one key do not contend here
// too. The table is bounded: once full, further keys are validated and built
// each time rather than kept.
type names struct {
	m sync.Map // key -> prefix+key
	n atomic.Int32
}

// maxNames bounds the table: about 100 KiB for keys of typical length.
const maxNames = 1024

// full returns prefix+key, or the reason key is no valid key.
func (n *names) full(prefix, key string) (string, error) {
	if full, ok := n.m.Load(key); ok {
		return full.(string), nil
	}
	if err := ValidateKey(key); err != nil {
		return "", err
	}
	full := prefix + key
	if n.n.Load() < maxNames {
		if _, loaded := n.m.LoadOrStore(key, full); !loaded {
			n.n.Add(1)
		}
	}
	return full, nil
}
