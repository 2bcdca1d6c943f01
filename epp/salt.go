package epp

import "github.com/kvroute/kvroute/router"

// setCacheSalt gives the router a request's cache salt. Requests with
// different salts share no cached blocks on vLLM; until router.Request
// carries the salt into the hash, a salted request is matched as an
// unsalted one.
func setCacheSalt(_ *router.Request, _ string) {}
