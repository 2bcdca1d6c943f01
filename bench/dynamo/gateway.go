package main

import (
	"context"
	"errors"
)

// prepareArms builds what the chosen arms need before the runs start.
func (b *bench) prepareArms(ctx context.Context) error { return nil }

func setupGateway(ctx context.Context, b *bench, d *Deployment, frontendPort int) (string, Chooser, error) {
	return "", nil, errors.New("not yet")
}
