import { describe, expect, it } from 'vitest';
import { readStartSettings } from '../../scripts/start-settings.js';

describe('npm start settings', () => {
  it('leaves the kapp-controller-config namespace to the runtime default when unset or blank', () => {
    expect(readStartSettings([], {})).toEqual({});
    expect(readStartSettings([], { KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE: ' ' })).toEqual({});
  });

  it('reads the namespace from the Lambda functions’ variable, as kapp-controller users keep it', () => {
    expect(readStartSettings([], { KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE: 'kapp-controller' })).toEqual({
      controllerConfigNamespace: 'kapp-controller',
    });
  });

  it('takes the flag over the variable', () => {
    expect(
      readStartSettings(['--controller-config-namespace', 'kapp-controller'], {
        KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE: 'other',
      }),
    ).toEqual({ controllerConfigNamespace: 'kapp-controller' });
    expect(readStartSettings(['--controller-config-namespace=kc'], {})).toEqual({ controllerConfigNamespace: 'kc' });
  });

  it('refuses a name that is not a namespace, naming where it came from', () => {
    expect(() => readStartSettings(['--controller-config-namespace', 'Kapp_Controller'], {})).toThrow(
      /--controller-config-namespace: expected a namespace name/,
    );
    expect(() => readStartSettings([], { KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE: 'x'.repeat(64) })).toThrow(
      /KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE: expected a namespace name/,
    );
  });

  it('refuses an unknown option and answers --help', () => {
    expect(() => readStartSettings(['--controller-config-ns', 'x'], {})).toThrow();
    expect(readStartSettings(['-h'], {})).toEqual({ help: true });
  });
});
