package framerpc

import "sync"

// frameBuf is a buffer for one frame's bytes, recycled once they are
// decoded or sent: a batch call moves tens of kilobytes each way, which
// would otherwise be garbage the collector runs for.
type frameBuf struct{ b []byte }

// maxPooledFrame is the largest buffer kept for reuse; larger frames are
// rare and their buffers go to the collector.
const maxPooledFrame = 1 << 20

var frames = sync.Pool{New: func() any { return new(frameBuf) }}

// getFrame returns a buffer, empty, with what capacity it kept.
func getFrame() *frameBuf {
	fb := frames.Get().(*frameBuf)
	fb.b = fb.b[:0]
	return fb
}

// putFrame recycles fb holding b, its bytes no longer used by anyone.
func putFrame(fb *frameBuf, b []byte) {
	if cap(b) > maxPooledFrame {
		b = nil
	}
	fb.b = b
	frames.Put(fb)
}
