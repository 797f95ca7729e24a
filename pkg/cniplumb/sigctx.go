// SPDX-License-Identifier: Apache-2.0

package cniplumb

import (
	"context"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
)

// signalContext is the context every verb gets: SIGTERM or SIGINT cancel it, so a call
// waiting for a lock gives up with a CNI error instead of dying silently. The handler
// goes in only when something first asks for Done: os/signal's receiver keeps a thread
// blocked for the life of the process, which costs every plugin start about 1.5 ms of
// CPU and twenty context switches, and most verbs never wait for anything. Until then a
// SIGTERM ends the process at once, as SIGKILL would; DEL and GC clean up after both.
type signalContext struct {
	context.Context // Background: no deadline, no values

	once   sync.Once
	active atomic.Pointer[context.Context]
	stop   context.CancelFunc
}

func newSignalContext() *signalContext {
	return &signalContext{Context: context.Background()}
}

// Done installs the handler on first use and returns the channel SIGTERM and SIGINT
// close.
func (c *signalContext) Done() <-chan struct{} {
	c.once.Do(func() {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		c.stop = stop
		c.active.Store(&ctx)
	})
	return (*c.active.Load()).Done()
}

// Err is nil until Done was called and a signal arrived.
func (c *signalContext) Err() error {
	if p := c.active.Load(); p != nil {
		return (*p).Err()
	}
	return nil
}

// release removes the handler, if it went in.
func (c *signalContext) release() {
	if c.active.Load() != nil {
		c.stop()
	}
}

func (c *signalContext) String() string { return "cniplumb.signalContext" }
