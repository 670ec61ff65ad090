//go:build race

package drivertest

// raceEnabled: built with -race, whose instrumentation slows the client
// several times over.
const raceEnabled = true
