package redis

import "strings"

// keySet names every Redis key and the channel that belong to one lock key.
// All share the hash tag {<key>}, so they live in one Cluster slot and a
// script may touch them together.
type keySet struct {
	lock, fence, queue, deadlines string
	readers, writer, writeWaiters string
	permits                       string
	channel                       string
}

// escapeTag keeps braces out of the hash tag: Redis Cluster hashes the text
// between the first '{' and the next '}', so a key containing them would
// otherwise split its lock's keys across slots. '%' is escaped too so that
// the encoding stays one-to-one.
func escapeTag(s string) string {
	if !strings.ContainsAny(s, "%{}") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%':
			b.WriteString("%25")
		case '{':
			b.WriteString("%7B")
		case '}':
			b.WriteString("%7D")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func (l *Locker) keys(key string) keySet {
	base := l.prefix + "{" + escapeTag(key) + "}"
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
