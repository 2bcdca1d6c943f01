package kvevents

import (
	"fmt"
	"math"

	"github.com/tinylib/msgp/msgp"
)

// AppendDynamoEvent appends d encoded as rmp_serde::to_vec_named encodes a
// RouterEvent: maps with field names, the data enum externally tagged
// ({"stored": {...}}, {"removed": {...}} or the string "cleared"), None as
// nil, residency_domain omitted when empty.
func AppendDynamoEvent(dst []byte, d *DynamoEvent) ([]byte, error) {
	n := uint32(3)
	if d.ResidencyDomain != "" {
		n++
	}
	dst = msgp.AppendMapHeader(dst, n)
	dst = msgp.AppendString(dst, "worker_id")
	dst = msgp.AppendUint64(dst, d.WorkerID)
	dst = msgp.AppendString(dst, "storage_tier")
	if d.StorageTier == "" {
		dst = msgp.AppendString(dst, DynamoTierDevice)
	} else {
		dst = msgp.AppendString(dst, d.StorageTier)
	}
	if d.ResidencyDomain != "" {
		dst = msgp.AppendString(dst, "residency_domain")
		dst = msgp.AppendString(dst, d.ResidencyDomain)
	}
	dst = msgp.AppendString(dst, "event")
	dst = msgp.AppendMapHeader(dst, 3)
	dst = msgp.AppendString(dst, "event_id")
	dst = msgp.AppendUint64(dst, d.EventID)
	dst = msgp.AppendString(dst, "data")
	switch d.Kind {
	case DynamoStored:
		dst = msgp.AppendMapHeader(dst, 1)
		dst = msgp.AppendString(dst, "stored")
		dst = msgp.AppendMapHeader(dst, 3)
		dst = msgp.AppendString(dst, "parent_hash")
		if d.HasParent {
			dst = msgp.AppendUint64(dst, d.ParentHash)
		} else {
			dst = msgp.AppendNil(dst)
		}
		dst = msgp.AppendString(dst, "start_position")
		dst = appendOptInt(dst, d.StartPosition)
		dst = msgp.AppendString(dst, "blocks")
		dst = msgp.AppendArrayHeader(dst, uint32(len(d.Blocks)))
		for i := range d.Blocks {
			dst = appendDynamoBlock(dst, &d.Blocks[i])
		}
	case DynamoRemoved:
		dst = msgp.AppendMapHeader(dst, 1)
		dst = msgp.AppendString(dst, "removed")
		dst = msgp.AppendMapHeader(dst, 1)
		dst = msgp.AppendString(dst, "block_hashes")
		dst = msgp.AppendArrayHeader(dst, uint32(len(d.Removed)))
		for _, h := range d.Removed {
			dst = msgp.AppendUint64(dst, h)
		}
	case DynamoCleared:
		dst = msgp.AppendString(dst, "cleared")
	default:
		return dst, fmt.Errorf("%w: dynamo event kind %d", ErrEncode, d.Kind)
	}
	dst = msgp.AppendString(dst, "dp_rank")
	dst = msgp.AppendUint32(dst, d.DPRank)
	return dst, nil
}

func appendDynamoBlock(dst []byte, b *DynamoBlock) []byte {
	dst = msgp.AppendMapHeader(dst, 3)
	dst = msgp.AppendString(dst, "block_hash")
	dst = msgp.AppendUint64(dst, b.BlockHash)
	dst = msgp.AppendString(dst, "tokens_hash")
	dst = msgp.AppendUint64(dst, b.TokensHash)
	dst = msgp.AppendString(dst, "mm_extra_info")
	if !b.MMInfo {
		return msgp.AppendNil(dst)
	}
	dst = msgp.AppendMapHeader(dst, 1)
	dst = msgp.AppendString(dst, "mm_objects")
	dst = msgp.AppendArrayHeader(dst, uint32(len(b.MMObjects)))
	for _, o := range b.MMObjects {
		dst = msgp.AppendMapHeader(dst, 2)
		dst = msgp.AppendString(dst, "mm_hash")
		dst = msgp.AppendUint64(dst, o.MMHash)
		dst = msgp.AppendString(dst, "offsets")
		dst = msgp.AppendArrayHeader(dst, uint32(len(o.Offsets)))
		for _, r := range o.Offsets {
			dst = msgp.AppendArrayHeader(dst, 2)
			dst = msgp.AppendUint64(dst, r[0])
			dst = msgp.AppendUint64(dst, r[1])
		}
	}
	return dst
}

// DecodeDynamoEvent decodes one msgpack RouterEvent (rmp_serde named
// maps; struct fields as arrays, as rmp_serde::to_vec writes them, are not
// accepted) from the start of p into d, reusing d's slices, and returns the
// bytes after it. Unknown fields are skipped. Errors wrap ErrMalformed.
func DecodeDynamoEvent(p []byte, d *DynamoEvent) ([]byte, error) {
	*d = DynamoEvent{StorageTier: DynamoTierDevice, Blocks: d.Blocks[:0], Removed: d.Removed[:0]}
	var err error
	p, err = readMap(p, "router event", func(key []byte, p []byte) ([]byte, error) {
		var err error
		switch string(key) {
		case "worker_id":
			d.WorkerID, p, err = msgp.ReadUint64Bytes(p)
		case "storage_tier":
			d.StorageTier, p, err = readDynamoTier(p)
		case "residency_domain":
			var s []byte
			if msgp.IsNil(p) {
				return p[1:], nil
			}
			s, p, err = msgp.ReadStringZC(p)
			switch string(s) {
			case ResidencyWorker:
				d.ResidencyDomain = ResidencyWorker
			case ResidencyCacheOwner:
				d.ResidencyDomain = ResidencyCacheOwner
			default:
				d.ResidencyDomain = string(s)
			}
		case "event":
			return readDynamoCacheEvent(p, d)
		default:
			return msgp.Skip(p)
		}
		return p, err
	})
	if err != nil {
		return p, err
	}
	if d.Kind == 0 {
		return p, fmt.Errorf("%w: dynamo event without data", ErrMalformed)
	}
	return p, nil
}

func readDynamoTier(p []byte) (string, []byte, error) {
	s, p, err := msgp.ReadStringZC(p)
	if err != nil {
		return "", p, err
	}
	switch string(s) {
	case DynamoTierDevice:
		return DynamoTierDevice, p, nil
	case DynamoTierHostPinned:
		return DynamoTierHostPinned, p, nil
	case DynamoTierDisk:
		return DynamoTierDisk, p, nil
	case DynamoTierExternal:
		return DynamoTierExternal, p, nil
	}
	return string(s), p, nil
}

func readDynamoCacheEvent(p []byte, d *DynamoEvent) ([]byte, error) {
	return readMap(p, "event", func(key []byte, p []byte) ([]byte, error) {
		var err error
		switch string(key) {
		case "event_id":
			d.EventID, p, err = msgp.ReadUint64Bytes(p)
		case "dp_rank":
			d.DPRank, p, err = msgp.ReadUint32Bytes(p)
		case "data":
			return readDynamoData(p, d)
		default:
			return msgp.Skip(p)
		}
		return p, err
	})
}

func readDynamoData(p []byte, d *DynamoEvent) ([]byte, error) {
	if msgp.NextType(p) == msgp.StrType {
		s, o, err := msgp.ReadStringZC(p)
		if err != nil {
			return o, malformed("dynamo data", err)
		}
		if string(s) != "cleared" {
			return o, fmt.Errorf("%w: dynamo data %q", ErrMalformed, s)
		}
		d.Kind = DynamoCleared
		return o, nil
	}
	return readMap(p, "data", func(key []byte, p []byte) ([]byte, error) {
		switch string(key) {
		case "stored":
			d.Kind = DynamoStored
			return readMap(p, "stored", func(key []byte, p []byte) ([]byte, error) {
				switch string(key) {
				case "parent_hash":
					if msgp.IsNil(p) {
						return p[1:], nil
					}
					var err error
					d.ParentHash, p, err = msgp.ReadUint64Bytes(p)
					d.HasParent = err == nil
					return p, err
				case "start_position":
					v, p, err := readOptInt(p)
					if err == nil && (v.Value < 0 || v.Value > math.MaxUint32) {
						err = fmt.Errorf("start_position %d out of range", v.Value)
					}
					d.StartPosition = v
					return p, err
				case "blocks":
					return readDynamoBlocks(p, d)
				}
				return msgp.Skip(p)
			})
		case "removed":
			d.Kind = DynamoRemoved
			return readMap(p, "removed", func(key []byte, p []byte) ([]byte, error) {
				if string(key) != "block_hashes" {
					return msgp.Skip(p)
				}
				n, p, err := readArrayHeader(p, 1)
				if err != nil {
					return p, err
				}
				for range n {
					var h uint64
					if h, p, err = msgp.ReadUint64Bytes(p); err != nil {
						return p, err
					}
					d.Removed = append(d.Removed, h)
				}
				return p, nil
			})
		case "cleared":
			d.Kind = DynamoCleared
			return msgp.Skip(p)
		}
		return p, fmt.Errorf("unknown data variant %q", key)
	})
}

func readDynamoBlocks(p []byte, d *DynamoEvent) ([]byte, error) {
	n, p, err := readArrayHeader(p, 1)
	if err != nil {
		return p, err
	}
	for range n {
		var b DynamoBlock
		p, err = readMap(p, "block", func(key []byte, p []byte) ([]byte, error) {
			var err error
			switch string(key) {
			case "block_hash":
				b.BlockHash, p, err = msgp.ReadUint64Bytes(p)
			case "tokens_hash":
				b.TokensHash, p, err = msgp.ReadUint64Bytes(p)
			case "mm_extra_info":
				if msgp.IsNil(p) {
					return p[1:], nil
				}
				b.MMInfo = true
				return readMap(p, "mm_extra_info", func(key []byte, p []byte) ([]byte, error) {
					if string(key) != "mm_objects" {
						return msgp.Skip(p)
					}
					return readMMObjects(p, &b)
				})
			default:
				return msgp.Skip(p)
			}
			return p, err
		})
		if err != nil {
			return p, err
		}
		d.Blocks = append(d.Blocks, b)
	}
	return p, nil
}

func readMMObjects(p []byte, b *DynamoBlock) ([]byte, error) {
	n, p, err := readArrayHeader(p, 1)
	if err != nil {
		return p, err
	}
	for range n {
		var o DynamoMMObject
		p, err = readMap(p, "mm_object", func(key []byte, p []byte) ([]byte, error) {
			var err error
			switch string(key) {
			case "mm_hash":
				o.MMHash, p, err = msgp.ReadUint64Bytes(p)
				return p, err
			case "offsets":
				var m uint32
				if m, p, err = readArrayHeader(p, 3); err != nil {
					return p, err
				}
				for range m {
					var k uint32
					if k, p, err = readArrayHeader(p, 1); err != nil {
						return p, err
					}
					if k != 2 {
						return p, fmt.Errorf("offset range of %d elements", k)
					}
					var r [2]uint64
					if r[0], p, err = msgp.ReadUint64Bytes(p); err != nil {
						return p, err
					}
					if r[1], p, err = msgp.ReadUint64Bytes(p); err != nil {
						return p, err
					}
					o.Offsets = append(o.Offsets, r)
				}
				return p, nil
			}
			return msgp.Skip(p)
		})
		if err != nil {
			return p, err
		}
		b.MMObjects = append(b.MMObjects, o)
	}
	return p, nil
}

// readArrayHeader reads an array header whose elements take at least
// minSize bytes each, rejecting counts the remaining bytes cannot hold.
func readArrayHeader(p []byte, minSize int) (uint32, []byte, error) {
	n, o, err := msgp.ReadArrayHeaderBytes(p)
	if err != nil {
		return 0, o, err
	}
	if int64(n)*int64(minSize) > int64(len(o)) {
		return 0, o, fmt.Errorf("array of %d elements in %d bytes", n, len(o))
	}
	return n, o, nil
}

// readMap reads a map with string keys, calling fn for each value.
func readMap(p []byte, what string, fn func(key, p []byte) ([]byte, error)) ([]byte, error) {
	n, p, err := msgp.ReadMapHeaderBytes(p)
	if err != nil {
		return p, malformed(what, err)
	}
	if int64(n)*2 > int64(len(p)) {
		return p, fmt.Errorf("%w: %s: %d map entries in %d bytes", ErrMalformed, what, n, len(p))
	}
	for range n {
		var key []byte
		if key, p, err = msgp.ReadStringZC(p); err != nil {
			return p, malformed(what+" key", err)
		}
		if p, err = fn(key, p); err != nil {
			return p, malformed(what+"."+string(key), err)
		}
	}
	return p, nil
}
