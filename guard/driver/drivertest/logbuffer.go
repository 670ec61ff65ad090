package drivertest

import (
	"strings"
	"sync"
)

// LogBuffer is a log's destination (slog.NewTextHandler(&buf, nil)) that
// the goroutines of what is tested may write while the test reads it.
type LogBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write implements io.Writer.
func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
