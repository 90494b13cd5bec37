// @ts-check
import eslint from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
    { ignores: ['out/**', 'dist/**', 'node_modules/**'] },
    eslint.configs.recommended,
    ...tseslint.configs.strict,
    {
        files: ['src/**/*.ts'],
        rules: {
            curly: 'error',
            eqeqeq: 'error',
            'no-throw-literal': 'error',
            '@typescript-eslint/naming-convention': [
                'error',
                { selector: 'typeLike', format: ['PascalCase'] },
                { selector: 'import', format: ['camelCase', 'PascalCase'] },
            ],
            '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_' }],
            '@typescript-eslint/explicit-module-boundary-types': 'error',
        },
    },
    {
        files: ['src/test/**/*.ts'],
        rules: {
            '@typescript-eslint/no-non-null-assertion': 'off',
            '@typescript-eslint/explicit-module-boundary-types': 'off',
        },
    },
);
