package redis

import "github.com/warden-go/warden/backends/internal/redistag"

// keySet names every Redis key and the channel that belong to one lock key.
// All share the hash tag {<key>}, so they live in one Cluster slot and a
// script may touch them together.
type keySet struct {
	lock, fence, queue, deadlines string
	readers, writer, writeWaiters string
	permits                       string
	channel                       string
}

func (l *Locker) keys(key string) keySet {
	base := l.prefix + "{" + redistag.Escape(key) + "}"
	return keySet{
		lock:         base + ":lock",
		fence:        base + ":fence",
		queue:        base + ":queue",
		deadlines:    base + ":queue:deadlines",
		readers:      base + ":readers",
		writer:       base + ":writer",
		writeWaiters: base + ":writers-waiting",
		permits:      base + ":permits",
		channel:      base + ":released",
	}
}
